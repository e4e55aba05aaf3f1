"""Sketched queries with many result rows, directly and through the proxy of one tree, side
by side in one run (session 30: a sketched query's rows relayed a read at a time).

``python many_rows.py <side>`` from a checkout's root (``PYTHONPATH=<tree>``): a throwaway
PostgreSQL 15 and the proxy of that tree; ``t`` holds 1M rows in 500,000 groups. Each query
runs three times through the proxy (the capture), then 5 times each directly, through the
proxy with its sketch, and through the proxy with ``IMP SET enabled = off`` (relayed
unwrapped), in turn; prints the medians, the ratios direct / sketched and direct / relayed
(above 1: the proxy is faster), the ``IMP EXPLAIN`` decision and whether every answer
matched.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import psycopg

from bench.proxy_process import launch_proxy
from imp_proxy.embedded import given_or_throwaway

Conn = psycopg.Connection[Any]
TABLES = (
    "CREATE TABLE t AS SELECT i AS id, (i * 7919::bigint) % 1000003 AS v, i % 500000 AS g"
    " FROM generate_series(1, 1000000) i",
    "VACUUM ANALYZE t",
)
QUERIES = {
    "500,000 groups, all pass": "SELECT g, sum(v) FROM t GROUP BY g HAVING sum(v) > 900"
                                " ORDER BY g",
    "50,000 groups pass": "SELECT g, sum(v) FROM t WHERE g < 50000 GROUP BY g"
                          " HAVING sum(v) > 900 ORDER BY g",
    "top-100,000 rows": "SELECT id, v FROM t ORDER BY v DESC, id LIMIT 100000",
}


def timed(conn: Conn, q: str) -> tuple[float, list[tuple[Any, ...]]]:
    t0 = time.perf_counter()
    rows = conn.execute(q).fetchall()
    return (time.perf_counter() - t0) * 1e3, rows


def one(d: Conn, p: Conn, off: Conn, name: str, q: str, side: str) -> None:
    want = timed(d, q)[1]
    same = sum(timed(p, q)[1] == want for _ in range(3))
    times: dict[str, list[float]] = {"direct": [], "sketched": [], "relayed": []}
    for _ in range(5):
        for label, conn in (("direct", d), ("sketched", p), ("relayed", off)):
            ms, rows = timed(conn, q)
            times[label].append(ms)
            if conn is not d:
                same += rows == want
    decision = dict(p.execute("IMP EXPLAIN " + q).fetchall()).get("decision")
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{side} | {name} | {len(want)} rows | direct {med['direct']:.0f} ms | sketched "
          f"{med['sketched']:.0f} ms | relayed {med['relayed']:.0f} ms | direct/sketched "
          f"{med['direct'] / med['sketched']:.2f}x | direct/relayed "
          f"{med['direct'] / med['relayed']:.2f}x | same {same}/13 | {decision}", flush=True)


def main() -> None:
    side = sys.argv[1] if len(sys.argv) > 1 else "tree"
    with given_or_throwaway(None) as dsn:
        with psycopg.connect(dsn, autocommit=True) as c:
            for stmt in TABLES:
                c.execute(stmt)
        proxy = launch_proxy(dsn, log_level="WARNING")
        try:
            via = psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=proxy.port)
            with psycopg.connect(dsn, autocommit=True) as d, \
                    psycopg.connect(via, autocommit=True) as p, \
                    psycopg.connect(via, autocommit=True) as off:
                off.execute("IMP SET enabled = off")
                for name, q in QUERIES.items():
                    one(d, p, off, name, q, side)
        finally:
            proxy.stop()


if __name__ == "__main__":
    main()
