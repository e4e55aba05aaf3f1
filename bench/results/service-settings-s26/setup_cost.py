"""What session 26's per-transaction settings add to a service connection's transaction:
the router's prepare setup (``BEGIN ISOLATION LEVEL REPEATABLE READ``, a ``SELECT``,
``ROLLBACK``, one simple Query as in ``imp_proxy/router.py``) with and without
``sketches.service.LOCAL_SETTINGS``, alternating blocks of 2,000 on a throwaway cluster (run
from the checkout's root: ``.venv/bin/python bench/results/service-settings-s26/setup_cost.py``)."""

from __future__ import annotations

import statistics
import time

import psycopg

from imp_proxy.embedded import LocalPostgres
from sketches.service import LOCAL_SETTINGS

BLOCKS, EXECUTIONS = 9, 2000


def block(conn: psycopg.Connection[tuple[object, ...]], setup: str) -> float:
    """Microseconds per setup and its ROLLBACK, over one block."""
    started = time.perf_counter()
    for _ in range(EXECUTIONS):
        cur = conn.execute(setup.encode())
        while cur.nextset():
            pass
        conn.execute(b"ROLLBACK")
    return (time.perf_counter() - started) / EXECUTIONS * 1e6


def main() -> None:
    pg = LocalPostgres.throwaway_cluster()
    pg.start()
    try:
        plain = "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT current_setting('search_path')"
        local = ("BEGIN ISOLATION LEVEL REPEATABLE READ; " + LOCAL_SETTINGS
                 + "; SELECT current_setting('search_path')")
        with psycopg.connect(pg.dsn(), autocommit=True) as c:
            block(c, plain), block(c, local)   # warm up
            pairs = [(block(c, plain), block(c, local)) for _ in range(BLOCKS)]
        added = [b - a for a, b in pairs]
        print(f"{BLOCKS} alternating blocks of {EXECUTIONS}: without"
              f" {statistics.median(a for a, _ in pairs):.1f} µs, with the settings"
              f" {statistics.median(b for _, b in pairs):.1f} µs; median added"
              f" {statistics.median(added):.1f} µs (blocks {min(added):.1f} … {max(added):.1f})")
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
