"""Python memory a SketchManager (and the module caches) holds after 800 distinct sketchable
queries with 256 KiB comments (tracemalloc, after a full collection), in-process. Run from a
checkout's root with ``PYTHONPATH=<tree>``; prints the top allocation sites."""

from __future__ import annotations

import gc
import sys
import tracemalloc
from typing import Any

import psycopg

from imp_proxy.embedded import given_or_throwaway
from sketches.manager import SketchManager, SketchSettings

QUERY = "SELECT g, sum(v) FROM cb {} GROUP BY g HAVING sum(v) > 19500 ORDER BY g"


def main(side: str) -> None:
    with given_or_throwaway(None) as dsn:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("DROP TABLE IF EXISTS cb")
            c.execute("CREATE TABLE cb (id int PRIMARY KEY, g int, v int)")
            c.execute("INSERT INTO cb SELECT i, i % 50, i % 97 FROM generate_series(1, 20000) i")
            c.execute("ANALYZE cb")
        m = SketchManager(SketchSettings())
        with psycopg.connect(dsn, autocommit=True) as svc:
            def prepare(q: str) -> Any:
                svc.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                try:
                    return m.prepare(svc, q, None)
                finally:
                    svc.execute("COMMIT")
            for _ in range(3):
                prepare(QUERY.format(""))
            gc.collect()
            tracemalloc.start()
            base = tracemalloc.take_snapshot()
            for i in range(800):
                decision = prepare(QUERY.format(f"/* {i} {'x' * (256 << 10)} */")).decision
            gc.collect()
            snap = tracemalloc.take_snapshot()
            cur, peak = tracemalloc.get_traced_memory()
            print(f"{side} held +{cur / 2**20:.0f} MiB (peak {peak / 2**20:.0f}),"
                  f" last decision {decision}")
            for stat in snap.compare_to(base, "lineno")[:6]:
                print("  ", stat)
        m.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tree")
