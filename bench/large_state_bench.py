"""What a large maintained state costs the proxy's clients (session 27: 1M groups).

Two parts, on a throwaway PostgreSQL 15 with a table of ``--rows`` rows, one group per row:

* **through the proxy** (a subprocess of this checkout): one client runs a HAVING query over
  every group several times, with writes in between, while a second client sends
  ``SELECT 1`` every 2 ms; reported are each query's time and the pings' latencies (how
  long the relay stalled for everyone else);
* **in process**: the library's state build, snapshot, save and reload of the same query,
  each timed, while a thread that sleeps 1 ms at a time records its longest wait (a stall
  of the interpreter).

    python -m bench.large_state_bench --out bench/results/large-state-s27/after.md

Run it from two work trees (before/after a change) for a side-by-side comparison
(``bench/results/large-state-s27/run.sh``).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

import pg_extensions
from bench.machine import machine_facts, revision
from bench.proxy_process import launch_proxy
from imp_proxy.embedded import given_or_throwaway as _cluster

QUERY = "SELECT g, sum(v) FROM big GROUP BY g HAVING sum(v) > 990"


def _load(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS big")
        c.execute("CREATE TABLE big (id int PRIMARY KEY, g int, v int)")
        c.execute("INSERT INTO big SELECT i, i, i %% 1000 FROM generate_series(1, %s) i",
                  (rows,))
        c.execute("ANALYZE big")


class _Pinger(threading.Thread):
    """``SELECT 1`` through the proxy every 2 ms; the latencies in seconds."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.latencies = dsn, list[float]()
        self.stop = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as c:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                c.execute("SELECT 1").fetchall()
                self.latencies.append(time.perf_counter() - t0)
                time.sleep(0.002)


def through_proxy(dsn: str, rows: int, wait_build: float) -> dict[str, Any]:
    """The query's times (capture, first uses, after writes) and the pings' latencies."""
    proxy = launch_proxy(dsn)
    try:
        pdsn = psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=proxy.port)
        pinger = _Pinger(pdsn)
        pinger.start()
        times: dict[str, tuple[float, float]] = {}
        with psycopg.connect(pdsn, autocommit=True) as q, \
                psycopg.connect(dsn, autocommit=True) as direct:
            want = sorted(direct.execute(QUERY).fetchall())

            def run(label: str) -> None:
                t0 = time.perf_counter()
                got = sorted(q.execute(QUERY).fetchall())
                t1 = time.perf_counter()
                if got != sorted(direct.execute(QUERY).fetchall()):
                    raise AssertionError(f"{label}: the proxy's answer differs")
                times[label] = (t1 - t0, time.perf_counter() - t1)
                time.sleep(2.0)

            assert want
            for label in ("1 capture", "2 next query", "3 next query"):
                run(label)
            direct.execute("UPDATE big SET v = v + 1 WHERE id <= 100")
            run("4 after a write")
            deadline = time.monotonic() + wait_build
            while time.monotonic() < deadline and not _state_built(q):
                time.sleep(0.5)
            waited = wait_build - (deadline - time.monotonic())
            times["(waited for the state to be built)"] = (waited, float("nan"))
            for n in (5, 6):
                direct.execute("UPDATE big SET v = v + 1 WHERE id <= 100")
                run(f"{n} after a write")
        pinger.stop.set()
        pinger.join()
        lat = sorted(pinger.latencies)
        return {"times": times, "pings": len(lat),
                "p50_ms": lat[len(lat) // 2] * 1e3, "p99_ms": lat[int(len(lat) * 0.99)] * 1e3,
                "max_ms": lat[-1] * 1e3, "over_100ms": sum(x > 0.1 for x in lat)}
    finally:
        proxy.stop()


def _state_built(conn: psycopg.Connection[Any]) -> bool:
    """Whether the library counted a state build (``…state_builds`` in ``IMP SHOW STATS``)."""
    return any(str(k).endswith("state_builds") and int(v or 0) > 0
               for k, v in conn.execute("IMP SHOW STATS").fetchall())


class _Ticker(threading.Thread):
    """Sleeps 1 ms at a time; the longest wait per phase (an interpreter stall)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.phase, self.worst = "", dict[str, float]()

    def run(self) -> None:
        last = time.perf_counter()
        while True:
            time.sleep(0.001)
            now = time.perf_counter()
            self.worst[self.phase] = max(self.worst.get(self.phase, 0.0), now - last)
            last = now


def in_process(dsn: str) -> dict[str, tuple[float, float]]:
    """(seconds, longest stall in seconds) of the state's build, snapshot, save, reload."""
    from bench.maintenance_bench import snapshot_conn
    from sketches import lookup
    from sketches.ivm import state as ivm_state
    from sketches.ivm.plan import SketchTarget, compile
    from sketches.ranges import build_partition
    from sketches.sql import analyse

    with psycopg.connect(dsn, autocommit=True) as c:
        pg_extensions.install(c)
        c.execute("SELECT imp.track_table('big'::regclass)")
        analysis = analyse(QUERY, lookup.resolver(c))
        target = SketchTarget(0, "g", build_partition(c, "public", "big", "g", 1000))
    ticker = _Ticker()
    ticker.start()
    out: dict[str, tuple[float, float]] = {}

    def phase(name: str, fn: Callable[[], Any]) -> Any:
        ticker.phase = name
        t0 = time.perf_counter()
        result = fn()
        out[name] = (time.perf_counter() - t0, ticker.worst.get(name, 0.0))
        ticker.phase = ""
        return result

    pipeline = compile(analysis, (target,))
    with snapshot_conn(dsn) as c:
        phase("build", lambda: pipeline.build_state(c))
        phase("snapshot", lambda: _encoded(pipeline))
        phase("save", lambda: ivm_state.save(c, "bench", pipeline))
        c.commit()
        again = compile(analysis, (target,))
        phase("reload", lambda: ivm_state.load(c, "bench", again))
        c.commit()
    return out


def _encoded(pipeline: Any) -> None:
    """The state's snapshot encoded and freed as a save does (in one pause of the
    collector), without the write."""
    from sketches.ivm import collector
    from sketches.ivm.codec import dumps

    with collector.paused():
        dumps(pipeline.snapshot())


def report(rows: int, wire: dict[str, Any], phases: dict[str, tuple[float, float]],
           facts: dict[str, Any]) -> str:
    lines = ["# Large state: query times and relay stalls", "",
             f"* {facts['timestamp_utc']}; git {revision(facts)}; {rows:,} rows, one group each",
             f"* query: `{QUERY}`", "", "## Through the proxy", "",
             "| step | through the proxy (s) | directly, right after (s) |", "|---|---:|---:|"]
    lines += [f"| {k} | {p:.2f} | {d:.2f} |" for k, (p, d) in wire["times"].items()]
    lines += ["", f"Pings (`SELECT 1` every 2 ms through the proxy, meanwhile): {wire['pings']:,};"
              f" p50 {wire['p50_ms']:.2f} ms, p99 {wire['p99_ms']:.1f} ms, longest"
              f" {wire['max_ms']:.0f} ms; {wire['over_100ms']} over 100 ms.", "",
              "## In process (the library alone)", "",
              "| phase | seconds | longest stall (ms) |", "|---|---:|---:|"]
    lines += [f"| {k} | {s:.2f} | {w * 1e3:.0f} |" for k, (s, w) in phases.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.large_state_bench",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--wait-build", type=float, default=120.0,
                    help="seconds to wait for a state built in the background")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    with _cluster(None) as dsn:
        _load(dsn, args.rows)
        wire = through_proxy(dsn, args.rows, args.wait_build)
        with psycopg.connect(dsn, autocommit=True) as c:
            version = str(c.execute("SELECT version()").fetchone()[0])  # type: ignore[index]
        phases = in_process(dsn)
    md = report(args.rows, wire, phases, machine_facts(version))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
