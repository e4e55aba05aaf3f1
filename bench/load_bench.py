"""Load and soak bench for the IMP proxy (issue 7, item 3).

N concurrent clients for a fixed time issue a mix of sketched queries (aggregation with HAVING,
top-k), plain queries and writes through the proxy, while some writers go straight to
PostgreSQL. Answers are checked in *quiesced rounds*: every ``--check-every`` seconds the
clients are paused at an operation boundary, every query template (each threshold and k of the
mix) runs through the proxy and directly, and the results must be identical; one more round
runs after the last client stopped. Any error on a proxy connection counts as a proxy error.
The proxy's RSS (``/proc/<pid>/status`` VmRSS) is sampled throughout.

    python -m bench.load_bench --clients 32 --seconds 60 --out bench/results/load_bench.md

Without ``--upstream`` a throwaway PostgreSQL 15 is started (and removed). The proxy is a
subprocess (``python -m imp_proxy serve``) started on this checkout's code and stopped by PID.
Exit status 1 when there was any mismatch or proxy error.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench.proxy_process import launch_proxy
from imp_proxy.embedded import given_or_throwaway as _cluster

log = logging.getLogger(__name__)


#: sketched templates: (name, SQL with one placeholder, values the mix draws from)
SKETCHED: tuple[tuple[str, str, tuple[int, ...]], ...] = (
    ("having-sum", "SELECT g, sum(v) AS s FROM events GROUP BY g HAVING sum(v) > %s ORDER BY g",
     (0,)),  # thresholds filled in from the data size (see _thresholds)
    ("having-count", "SELECT g, count(*) AS n FROM events GROUP BY g HAVING count(*) > %s "
                     "ORDER BY g", (0,)),
    ("topk-max", "SELECT g, max(v) AS m FROM events GROUP BY g ORDER BY m DESC, g LIMIT %s",
     (3, 10)),
    ("topk-sum", "SELECT g, sum(v) AS s FROM events GROUP BY g ORDER BY s DESC, g LIMIT %s",
     (5,)),
)
PLAIN = (
    ("point", "SELECT v, pad FROM events WHERE id = %s"),
    ("group-count", "SELECT count(*) FROM events WHERE g = %s"),
)
GROUPS = 1000


@dataclass(frozen=True, slots=True)
class LoadConfig:
    clients: int = 32
    seconds: float = 60.0
    rows: int = 100_000
    direct_writers: int = 4         # of ``clients``, these write straight to PostgreSQL
    check_every: float = 10.0       # seconds between quiesced answer checks
    upstream: str | None = None     # superuser DSN of the cluster; None: a throwaway one
    seed: int = 20261121
    rss_interval: float = 0.5
    proxy_log_level: str = "WARNING"


@dataclass
class LoadResult:
    config: LoadConfig
    elapsed: float = 0.0
    ops: Counter[str] = field(default_factory=Counter)
    latencies: dict[str, list[float]] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    error_samples: list[str] = field(default_factory=list)
    checks: int = 0
    compared: int = 0
    mismatches: list[str] = field(default_factory=list)
    rss: list[tuple[float, int]] = field(default_factory=list)   # (seconds, KiB)
    proxy_stats: dict[str, str] = field(default_factory=dict)

    @property
    def total_ops(self) -> int:
        return sum(self.ops.values())

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.errors


# ---------------------------------------------------------------- processes

def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


@contextmanager
def _database(admin_dsn: str, rows: int) -> Iterator[str]:
    name = f"load_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=name)
    try:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("CREATE TABLE events (id bigserial PRIMARY KEY, g int NOT NULL, "
                      "v int NOT NULL, pad text)")
            c.execute("INSERT INTO events (g, v, pad) SELECT i %% %s, (i * 7919) %% 10007, "
                      "md5(i::text) FROM generate_series(1, %s) i", (GROUPS, rows))
            c.execute("CREATE INDEX ON events (g)")
            c.execute("ANALYZE events")
        yield dsn
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _thresholds(rows: int) -> dict[str, tuple[int, ...]]:
    """HAVING thresholds that keep a few percent of the groups (so sketches skip data)."""
    per_group = rows / GROUPS
    mean_sum = per_group * 5003
    return {"having-sum": (int(mean_sum * 1.12), int(mean_sum * 1.2)),
            "having-count": (int(per_group) + 1,)}


def templates(rows: int) -> list[tuple[str, str, int]]:
    """Every (name, SQL text, value) instance the mix uses — what a quiesced check runs."""
    th = _thresholds(rows)
    out = []
    for name, text, values in SKETCHED:
        for v in th.get(name, values):
            out.append((name, text, v))
    return out


# ---------------------------------------------------------------- pausing at op boundaries

class Gate:
    """Workers ``enter``/``exit`` around each operation; ``pause`` waits until none is in
    flight and holds new ones until ``resume``."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._paused = False
        self._active = 0

    def enter(self) -> None:
        with self._cv:
            while self._paused:
                self._cv.wait()
            self._active += 1

    def exit(self) -> None:
        with self._cv:
            self._active -= 1
            self._cv.notify_all()

    def pause(self) -> None:
        with self._cv:
            self._paused = True
            while self._active:
                self._cv.wait()

    def resume(self) -> None:
        with self._cv:
            self._paused = False
            self._cv.notify_all()


# ---------------------------------------------------------------- the run

def _worker(idx: int, dsn: str, direct: bool, cfg: LoadConfig, stop: threading.Event,
            gate: Gate, res: LoadResult, lock: threading.Lock,
            tmpl: list[tuple[str, str, int]]) -> None:
    rng = random.Random(cfg.seed * 1000 + idx)
    simple = idx % 2 == 0  # half the proxy clients use the simple protocol (client binding)
    cursor_factory: Any = psycopg.ClientCursor if simple else psycopg.Cursor
    kind_prefix = "direct-" if direct else ""
    try:
        conn = psycopg.connect(dsn, autocommit=True, cursor_factory=cursor_factory,
                               application_name=f"load-{idx}")
    except psycopg.Error as exc:
        with lock:
            res.errors[f"connect: {type(exc).__name__}"] += 1
            res.error_samples.append(f"client {idx} connect: {exc}")
        return
    max_id = cfg.rows
    with conn:
        while not stop.is_set():
            r = rng.random()
            gate.enter()
            t0 = time.perf_counter()
            try:
                if direct or r < 0.2:
                    kind = kind_prefix + _write(conn, rng, max_id)
                elif r < 0.65:
                    name, text, value = rng.choice(tmpl)
                    conn.execute(text, (value,)).fetchall()
                    kind = name
                else:
                    name, text = rng.choice(PLAIN)
                    arg = rng.randint(1, max_id) if name == "point" else rng.randrange(GROUPS)
                    conn.execute(text, (arg,)).fetchall()
                    kind = name
            except psycopg.Error as exc:
                with lock:
                    res.errors[f"{type(exc).__name__}"] += 1
                    if len(res.error_samples) < 20:
                        res.error_samples.append(f"client {idx}: {exc}")
                if conn.broken:
                    return
                continue
            finally:
                gate.exit()
            dt = time.perf_counter() - t0
            with lock:
                res.ops[kind] += 1
                res.latencies.setdefault(kind, []).append(dt)
            if direct:
                time.sleep(0.005)  # direct writers: steady, not a flood


def _write(conn: psycopg.Connection[Any], rng: random.Random, max_id: int) -> str:
    r = rng.random()
    if r < 0.6:
        conn.execute("UPDATE events SET v = v + %s WHERE id = %s",
                     (rng.randint(-500, 3000), rng.randint(1, max_id)))
        return "update"
    if r < 0.85:
        conn.execute("INSERT INTO events (g, v, pad) VALUES (%s, %s, 'load')",
                     (rng.randrange(GROUPS), rng.randint(0, 20000)))
        return "insert"
    conn.execute("DELETE FROM events WHERE id = %s", (rng.randint(1, max_id),))
    return "delete"


def quiesced_check(proxied: str, direct: str, tmpl: list[tuple[str, str, int]],
                   res: LoadResult) -> None:
    """Every template through the proxy (both protocols) and directly: identical rows."""
    with psycopg.connect(direct, autocommit=True) as d, \
            psycopg.connect(proxied, autocommit=True) as p, \
            psycopg.connect(proxied, autocommit=True, cursor_factory=psycopg.ClientCursor) as s:
        for name, text, value in tmpl:
            want = d.execute(text, (value,)).fetchall()
            for label, conn in (("extended", p), ("simple", s)):
                got = conn.execute(text, (value,)).fetchall()
                res.compared += 1
                if got != want:
                    res.mismatches.append(f"check {res.checks}: {name}({value}) {label}: "
                                          f"{len(got)} rows via proxy, {len(want)} direct")
    res.checks += 1


def _proxy_stats(proxied: str) -> dict[str, str]:
    with psycopg.connect(proxied, autocommit=True) as c:
        return {str(k): str(v) for k, v in c.execute("IMP SHOW STATS").fetchall()}


def run(cfg: LoadConfig, progress: Callable[[str], None] = lambda _: None) -> LoadResult:
    res = LoadResult(cfg)
    with _cluster(cfg.upstream) as admin, _database(admin, cfg.rows) as direct:
        proxy = launch_proxy(admin, log_level=cfg.proxy_log_level)
        try:
            proxied = psycopg.conninfo.make_conninfo(direct, host="127.0.0.1", port=proxy.port)
            tmpl = templates(cfg.rows)
            quiesced_check(proxied, direct, tmpl, res)  # warm-up: first captures
            progress(f"proxy pid {proxy.proc.pid}, {cfg.clients} clients, {cfg.seconds:g} s")
            stop, gate, lock = threading.Event(), Gate(), threading.Lock()
            t_start = time.monotonic()
            sampler_stop = threading.Event()

            def sample() -> None:
                while not sampler_stop.is_set():
                    res.rss.append((time.monotonic() - t_start, rss_kib(proxy.proc.pid)))
                    sampler_stop.wait(cfg.rss_interval)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            workers = [threading.Thread(
                target=_worker, daemon=True,
                args=(i, direct if i < cfg.direct_writers else proxied, i < cfg.direct_writers,
                      cfg, stop, gate, res, lock, tmpl)) for i in range(cfg.clients)]
            for w in workers:
                w.start()
            next_check = t_start + cfg.check_every
            while (now := time.monotonic()) < t_start + cfg.seconds:
                time.sleep(min(0.2, max(0.0, t_start + cfg.seconds - now)))
                if time.monotonic() >= next_check and \
                        time.monotonic() < t_start + cfg.seconds - 1:
                    gate.pause()
                    try:
                        quiesced_check(proxied, direct, tmpl, res)
                    finally:
                        gate.resume()
                    progress(f"t={time.monotonic() - t_start:.0f}s check {res.checks}: "
                             f"{res.total_ops} ops, {len(res.mismatches)} mismatches, "
                             f"{sum(res.errors.values())} errors")
                    next_check = time.monotonic() + cfg.check_every
            stop.set()
            for w in workers:
                w.join(60)
            res.elapsed = time.monotonic() - t_start
            quiesced_check(proxied, direct, tmpl, res)  # final, writers stopped
            sampler_stop.set()
            sampler.join(5)
            res.proxy_stats = _proxy_stats(proxied)
            if proxy.proc.poll() is not None:
                res.errors["proxy exited"] += 1
        finally:
            proxy.stop()
    return res


# ---------------------------------------------------------------- report

def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def report(res: LoadResult, command: str) -> str:
    cfg = res.config
    rss = [k for _, k in res.rss]
    lines = [
        "# Load bench (issue 7)", "",
        f"Command: `{command}`", "",
        f"Machine: {os.cpu_count()} CPUs; PostgreSQL 15 "
        f"({'given upstream' if cfg.upstream else 'throwaway cluster'}); proxy subprocess "
        "with the sketch library (default SketchManager per database).", "",
        f"* clients: {cfg.clients} ({cfg.direct_writers} writing directly to PostgreSQL, "
        f"{cfg.clients - cfg.direct_writers} through the proxy, half simple / half extended "
        "protocol)",
        f"* duration: {res.elapsed:.1f} s; table `events`: {cfg.rows} rows, {GROUPS} groups",
        f"* operations: {res.total_ops} ({res.total_ops / max(res.elapsed, 1e-9):.0f}/s)",
        f"* proxy errors: {sum(res.errors.values())}"
        + (f" ({dict(res.errors)})" if res.errors else ""),
        f"* quiesced answer checks: {res.checks} rounds, {res.compared} query results "
        f"compared (proxy vs direct), mismatches: {len(res.mismatches)}",
        f"* proxy RSS: min {min(rss, default=0) / 1024:.1f} MiB, max "
        f"{max(rss, default=0) / 1024:.1f} MiB, first {rss[0] / 1024 if rss else 0:.1f} MiB, "
        f"last {rss[-1] / 1024 if rss else 0:.1f} MiB ({len(rss)} samples)",
        "", "| operation | count | ops/s | p50 ms | p95 ms |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for kind in sorted(res.ops):
        lat = res.latencies.get(kind, [])
        lines.append(f"| {kind} | {res.ops[kind]} | {res.ops[kind] / max(res.elapsed, 1e-9):.1f}"
                     f" | {statistics.median(lat) * 1000 if lat else 0:.1f}"
                     f" | {_pct(lat, 0.95) * 1000:.1f} |")
    lines += ["", "Proxy RSS over time:", "", "| t (s) | RSS (MiB) |", "| ---: | ---: |"]
    step = max(1, len(res.rss) // 12)
    for t, k in res.rss[::step]:
        lines.append(f"| {t:.0f} | {k / 1024:.1f} |")
    keys = ("proxy.wrapped", "proxy.used", "proxy.captured", "proxy.fallbacks",
            "proxy.passthrough", "proxy.connections", "maintenance", "captures", "uses",
            "invalidated")
    lines += ["", "Proxy counters (IMP SHOW STATS) after the run: "
              + ", ".join(f"{k} {res.proxy_stats[k]}" for k in keys if k in res.proxy_stats)]
    if res.mismatches:
        lines += ["", "Mismatches:", *[f"* {m}" for m in res.mismatches[:20]]]
    if res.error_samples:
        lines += ["", "Errors:", *[f"* {e}" for e in res.error_samples[:20]]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--direct-writers", type=int, default=4)
    parser.add_argument("--check-every", type=float, default=10.0)
    parser.add_argument("--upstream", help="superuser DSN (default: a throwaway cluster)")
    parser.add_argument("--seed", type=int, default=20261121)
    parser.add_argument("--out", type=Path, help="write the markdown report here")
    parser.add_argument("--proxy-log-level", default="WARNING",
                        help="the proxy's log level (its log file is named in the report)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    cfg = LoadConfig(clients=args.clients, seconds=args.seconds, rows=args.rows,
                     direct_writers=args.direct_writers, check_every=args.check_every,
                     upstream=args.upstream, seed=args.seed,
                     proxy_log_level=args.proxy_log_level)
    res = run(cfg, progress=log.info)
    command = "python -m bench.load_bench " + " ".join(
        a for a in (argv if argv is not None else sys.argv[1:]) if "postgres" not in a)
    text = report(res, command.strip())
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
