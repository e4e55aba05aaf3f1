"""Sketched queries whose sketch keeps many scattered fragments, directly and through the
proxy of one tree, side by side in one run (session 29: ``compare_cost``).

``python worth.py <side>`` from a checkout's root (``PYTHONPATH=<tree>``): starts a throwaway
PostgreSQL 15 and the proxy of that tree; loads ``t`` (1M rows, 2,000 groups stored in order,
index on ``g``), ``alt`` (the same, every other block of four groups summing high) and ``mg``
(1M rows, 200,000 groups of 5, 1 % of them summing high, scattered); runs each query three
times (the capture), then 7 times directly and 7 times through the proxy, alternating, and
prints the medians, their ratio (direct / proxied: above 1 the proxy is faster), the
``IMP EXPLAIN`` reason and whether every answer matched.
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
    "CREATE TABLE t (id int PRIMARY KEY, g int NOT NULL, v int NOT NULL)",
    "INSERT INTO t SELECT i, i % 2000, (i * 37) % 1000 FROM generate_series(1, 1000000) i"
    " ORDER BY i % 2000",
    "CREATE INDEX ON t (g)",
    "CREATE TABLE alt (id int PRIMARY KEY, g int NOT NULL, v int NOT NULL)",
    "INSERT INTO alt SELECT i, i % 2000, CASE WHEN i % 2000 / 4 % 2 = 0 THEN 10 ELSE 1 END"
    " FROM generate_series(1, 1000000) i ORDER BY i % 2000",
    "CREATE INDEX ON alt (g)",
    "CREATE TABLE mg (id int PRIMARY KEY, g int NOT NULL, v int NOT NULL)",
    "INSERT INTO mg SELECT i, i % 200000, CASE WHEN hashint4(i % 200000) % 100 = 0 THEN 100"
    " ELSE 1 END FROM generate_series(1, 1000000) i ORDER BY i % 200000",
    "VACUUM ANALYZE",
)
LITERALS = ", ".join(str(i) for i in range(0, 10000, 2))
QUERIES = {
    "selective (18 groups)": "SELECT g, sum(v) FROM t GROUP BY g HAVING sum(v) > 495000"
                             " ORDER BY g",
    "half the groups, 73 ranges": "SELECT g, sum(v) FROM t GROUP BY g HAVING sum(v) > 260000"
                                  " ORDER BY g",
    "alternating blocks": "SELECT g, sum(v) FROM alt GROUP BY g HAVING sum(v) > 1000 ORDER BY g",
    "200K groups, 1 % scattered": "SELECT g, sum(v) FROM mg GROUP BY g HAVING sum(v) > 100"
                                  " ORDER BY g",
    "IN list of 5,000 literals": f"SELECT g, sum(v) FROM t WHERE g IN ({LITERALS}) GROUP BY g"
                                 " HAVING sum(v) > 260000 ORDER BY g",
    "top-10 groups": "SELECT g, sum(v) FROM t GROUP BY g ORDER BY sum(v) DESC, g LIMIT 10",
}


def timed(conn: Conn, q: str) -> tuple[float, list[tuple[Any, ...]]]:
    t0 = time.perf_counter()
    rows = [tuple(r) for r in conn.execute(q).fetchall()]
    return (time.perf_counter() - t0) * 1e3, rows


def one(p: Conn, d: Conn, name: str, q: str, side: str) -> None:
    want = timed(d, q)[1]
    same = sum(timed(p, q)[1] == want for _ in range(3))
    direct: list[float] = []
    proxied: list[float] = []
    for _ in range(7):
        for conn, out in ((d, direct), (p, proxied)):
            ms, rows = timed(conn, q)
            out.append(ms)
            same += conn is d or rows == want
    reason = dict(p.execute("IMP EXPLAIN " + q).fetchall()).get("reason")
    dm, pm = statistics.median(direct), statistics.median(proxied)
    print(f"{side} | {name} | direct {dm:.0f} ms | proxy {pm:.0f} ms | {dm / pm:.2f}x |"
          f" same {same}/17 | {reason}", flush=True)


def main() -> None:
    side = sys.argv[1] if len(sys.argv) > 1 else "tree"
    with given_or_throwaway(None) as dsn:
        with psycopg.connect(dsn, autocommit=True) as c:
            for stmt in TABLES:
                c.execute(stmt)
        proxy = launch_proxy(dsn, log_level="WARNING")
        try:
            via = psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=proxy.port)
            with psycopg.connect(via, autocommit=True) as p, \
                    psycopg.connect(dsn, autocommit=True) as d:
                for name, q in QUERIES.items():
                    one(p, d, name, q, side)
        finally:
            proxy.stop()


if __name__ == "__main__":
    main()
