"""Latency the proxy adds to one sketched query (issue 3: what a wrapped query costs).

One client runs a small HAVING query (a table of ``--rows`` rows, so the query itself takes
well under a millisecond and the proxy's own round trips show) directly on PostgreSQL and
through the proxy, in blocks that alternate between the two, in two scenarios:

* ``unchanged``: nothing is written between the queries. The proxy answers the library's part
  from memory (same snapshot as the previous query: ``proxy.answered_in_memory``);
* ``after a write``: a one-row UPDATE is committed directly on PostgreSQL before each query
  (not timed), so every query through the proxy maintains its sketch on a service connection.

Both protocols: the simple Query (psycopg ``ClientCursor``) and the extended one (the default
cursor, with a parameter). Every answer through the proxy is compared with the direct one.

    python -m bench.latency_bench --out bench/results/latency_bench.md

Without ``--upstream`` a throwaway PostgreSQL 15 is started (and removed); the proxy is a
subprocess on this checkout's code, stopped by PID. Exit status 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench.machine import machine_facts, revision
from bench.proxy_process import proxied
from imp_proxy.embedded import given_or_throwaway as _cluster

log = logging.getLogger(__name__)

QUERY = "SELECT g, sum(v) FROM lat GROUP BY g HAVING sum(v) > %s ORDER BY g"
SCENARIOS = ("unchanged", "after a write")
PROTOCOLS = ("simple", "extended")
SYSTEMS = ("direct", "proxy")


@dataclass
class Result:
    samples: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)
    checked: int = 0
    mismatches: list[str] = field(default_factory=list)
    counters: dict[str, dict[str, int]] = field(default_factory=dict)
    snapshot_changes: dict[str, int] = field(default_factory=dict)
    """Per scenario: how often the cluster's snapshot changed between proxied queries (read
    directly before each one and at the end): every commit of a transaction with an xid —
    the writer's, but also autovacuum's or any other session's — starts a new snapshot."""


def _load(dsn: str, rows: int) -> int:
    """Creates ``lat`` (100 groups); returns a threshold a few groups pass."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS lat")
        c.execute("CREATE TABLE lat (id int PRIMARY KEY, g int NOT NULL, v int NOT NULL)")
        c.execute("INSERT INTO lat SELECT i, i %% 100, (i * 37) %% 1000"
                  " FROM generate_series(1, %s) AS i ORDER BY i %% 100", (rows,))
        c.execute("ANALYZE lat")
        row = c.execute("SELECT percentile_disc(0.95) WITHIN GROUP (ORDER BY s)"
                        " FROM (SELECT sum(v) AS s FROM lat GROUP BY g) AS t").fetchone()
    assert row is not None
    return int(row[0])


def _run(conn: psycopg.Connection[Any], protocol: str, threshold: int) -> list[Any]:
    if protocol == "simple":
        with psycopg.ClientCursor(conn) as cur:
            return cur.execute(QUERY, (threshold,)).fetchall()
    return conn.execute(QUERY, (threshold,)).fetchall()


def _counters(conn: psycopg.Connection[Any]) -> dict[str, int]:
    keep = ("proxy.wrapped", "proxy.used", "proxy.answered_in_memory", "proxy.fallbacks",
            "maintenances")
    return {k: int(v) for k, v in conn.execute("IMP SHOW STATS").fetchall() if k in keep}


def _snapshot(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT pg_current_snapshot()::text").fetchone()
    assert row is not None
    return str(row[0])


def _warm_up(p: psycopg.Connection[Any], d: psycopg.Connection[Any], threshold: int,
             timeout: float = 60.0, rounds: int = 3) -> str:
    """Runs the query through the proxy (``p``), both protocols in turn, until ``rounds``
    rounds in a row are answered from memory: the sketch is captured, its table tracked (in
    the proxy's background), its state built and saved, so the timed queries measure the
    steady state. Returns the cluster's snapshot read (on ``d``) right before the last round:
    the snapshot of the answers the proxy keeps (a commit in between would have made that
    round miss)."""
    deadline = time.monotonic() + timeout
    good = 0
    snapshot = ""
    while good < rounds:
        before = _counters(p).get("proxy.answered_in_memory", 0)
        snapshot = _snapshot(d)
        for protocol in PROTOCOLS:
            _run(p, protocol, threshold)
        hits = _counters(p).get("proxy.answered_in_memory", 0) - before
        good = good + 1 if hits == len(PROTOCOLS) else 0
        if time.monotonic() > deadline:
            raise RuntimeError("the proxy never answered from memory: no steady state")
        time.sleep(0.05)
    return snapshot


def measure(direct_dsn: str, proxy_dsn: str, threshold: int, blocks: int,
            per_block: int) -> Result:
    res = Result()
    with psycopg.connect(direct_dsn, autocommit=True) as d, \
            psycopg.connect(proxy_dsn, autocommit=True) as p, \
            psycopg.connect(direct_dsn, autocommit=True) as writer:
        conns = {"direct": d, "proxy": p}
        snapshot = _warm_up(p, d, threshold)
        for scenario in SCENARIOS:
            before, changes = _counters(p), 0
            for block in range(blocks):
                for protocol in PROTOCOLS:
                    order = SYSTEMS if block % 2 == 0 else SYSTEMS[::-1]
                    for system in order:
                        times = res.samples.setdefault((scenario, protocol, system), [])
                        for i in range(per_block + 5):  # 5 warm-up queries per block
                            if scenario == "after a write":
                                writer.execute("UPDATE lat SET v = v + 1 WHERE id = %s",
                                               (1 + (block * 7919 + i) % 1000,))
                            if system == "proxy":
                                now = _snapshot(d)
                                changes += now != snapshot
                                snapshot = now
                            t0 = time.perf_counter()
                            got = _run(conns[system], protocol, threshold)
                            if i >= 5:
                                times.append((time.perf_counter() - t0) * 1e3)
                            if system == "proxy":
                                want = _run(d, protocol, threshold)
                                res.checked += 1
                                if got != want:
                                    res.mismatches.append(f"{scenario}/{protocol}: {got} != "
                                                          f"{want}")
            after = _counters(p)
            res.counters[scenario] = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            now = _snapshot(d)
            res.snapshot_changes[scenario] = changes + (now != snapshot)
            snapshot = now
            log.info("%s done: %s, the snapshot changed %d times", scenario,
                     res.counters[scenario], res.snapshot_changes[scenario])
    return res


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def report(res: Result, facts: dict[str, Any], command: str, rows: int, blocks: int,
           per_block: int) -> str:
    lines = [
        "# Latency the proxy adds to a sketched query", "",
        f"Command: `{command}` at git {revision(facts)}", "",
        f"* {facts['timestamp_utc']}; machine: nproc {facts['nproc']}; load average "
        f"{' / '.join(f'{x:.2f}' for x in facts['loadavg_at_start'])} at the end",
        f"* table `lat`: {rows:,} rows, 100 groups; query `{QUERY}` (a threshold 5 groups "
        "pass); one client, autocommit",
        "* first, queries through the proxy until both protocols are answered from memory "
        "three times in a row (sketch captured, table tracked, state built and saved)",
        f"* {blocks} blocks of {per_block} timed queries (after 5 untimed) per system, "
        "protocol and scenario, direct and proxy alternating block by block; medians and "
        "90th percentiles of all timed queries",
        f"* answers compared (proxy vs direct): {res.checked}, mismatches: "
        f"{len(res.mismatches)}", "",
        "| scenario | protocol | direct p50 ms | proxy p50 ms | added p50 ms | direct p90 ms "
        "| proxy p90 ms | proxy / direct (p50) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for scenario in SCENARIOS:
        for protocol in PROTOCOLS:
            d = res.samples.get((scenario, protocol, "direct"), [])
            p = res.samples.get((scenario, protocol, "proxy"), [])
            if not d or not p:
                continue
            dm, pm = statistics.median(d), statistics.median(p)
            lines.append(f"| {scenario} | {protocol} | {dm:.3f} | {pm:.3f} | +{pm - dm:.3f} | "
                         f"{_pct(d, 0.9):.3f} | {_pct(p, 0.9):.3f} | {pm / dm:.2f} |")
    lines += ["", "Proxy counters per scenario (IMP SHOW STATS, difference over the scenario, "
              "warm-up queries included):", ""]
    for scenario, counts in res.counters.items():
        lines.append(f"* {scenario}: " + ", ".join(f"{k} {v}" for k, v in counts.items())
                     + "; the cluster's snapshot changed between proxied queries "
                     f"{res.snapshot_changes.get(scenario, 0)} times")
    if res.mismatches:
        lines += ["", "Mismatches:", *[f"* {m}" for m in res.mismatches[:20]]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.latency_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=5_000)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--per-block", type=int, default=200)
    parser.add_argument("--upstream", help="superuser DSN (default: a throwaway cluster)")
    parser.add_argument("--out", type=Path, help="write the markdown report here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    with _cluster(args.upstream) as dsn:
        threshold = _load(dsn, args.rows)
        with proxied(dsn) as proxy_dsn:
            res = measure(dsn, proxy_dsn, threshold, args.blocks, args.per_block)
    command = "python -m bench.latency_bench " + " ".join(
        a for a in (argv if argv is not None else sys.argv[1:]) if "postgres" not in a)
    text = report(res, machine_facts(), command.strip(), args.rows, args.blocks,
                  args.per_block)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0 if not res.mismatches else 1


if __name__ == "__main__":
    sys.exit(main())
