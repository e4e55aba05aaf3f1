"""What session 25's DDL-guard check adds to every delta read's probe: the probe's first
columns with and without ``pg_extensions.GUARDED``, prepared, alternating blocks of 2,000
executions on a throwaway cluster (run from the checkout's root:
``.venv/bin/python bench/results/guard-cost-s25/guard_cost.py``)."""

from __future__ import annotations

import statistics
import time

import psycopg

import pg_extensions
from imp_proxy.embedded import LocalPostgres

BLOCKS, EXECUTIONS = 9, 2000


def block(conn: psycopg.Connection[tuple[object, ...]], query: str) -> float:
    """Microseconds per execution of ``query``, over one block."""
    started = time.perf_counter()
    for _ in range(EXECUTIONS):
        conn.execute(query.encode()).fetchone()
    return (time.perf_counter() - started) / EXECUTIONS * 1e6


def main() -> None:
    pg = LocalPostgres.throwaway_cluster()
    pg.start()
    try:
        with psycopg.connect(pg.dsn(), autocommit=True) as c:
            pg_extensions.install(c)
        without = "SELECT pg_current_snapshot()::text, true"
        with_guard = f"SELECT pg_current_snapshot()::text, ({pg_extensions.GUARDED})"
        with psycopg.connect(pg.dsn(), autocommit=True, prepare_threshold=0) as c:
            block(c, without), block(c, with_guard)   # warm up, prepare
            pairs = [(block(c, without), block(c, with_guard)) for _ in range(BLOCKS)]
        added = [b - a for a, b in pairs]
        plain = statistics.median(a for a, _ in pairs)
        guarded = statistics.median(b for _, b in pairs)
        print(f"{BLOCKS} alternating blocks of {EXECUTIONS}: without {plain:.1f} µs, with the"
              f" guard check {guarded:.1f} µs; median added {statistics.median(added):.1f} µs"
              f" (blocks {min(added):.1f} … {max(added):.1f})")
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
