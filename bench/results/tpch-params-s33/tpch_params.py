"""Two TPC-H-shaped queries the proxy passed through before session 33, directly vs through
the proxy: a date parameter psycopg sends in binary format (``l_shipdate >= %s``), and
TPC-H's revenue ``sum(l_extendedprice * (1 - l_discount))`` in the select list of a HAVING
query. TPC-H at scale factor 0.1 (lineitem 600,000 rows), a throwaway PostgreSQL 15, this
tree's proxy.

``PYTHONPATH=<tree> python bench/results/tpch-params-s33/tpch_params.py`` from a checkout's
root; prints per query the medians of 15 timed executions each way (alternating, after 4
untimed ones through the proxy), their ratio, and the proxy's counters over the timed runs.
"""

from __future__ import annotations

import datetime as dt
import statistics
import tempfile
import time
from pathlib import Path

import psycopg

import pg_extensions
from bench.datagen import load_tpch
from bench.proxy_process import launch_proxy
from imp_proxy.embedded import given_or_throwaway

QUERIES = {
    "date parameter (binary)": (
        "SELECT l_orderkey, sum(l_quantity) AS q, count(*) FROM lineitem"
        " WHERE l_shipdate >= %s GROUP BY l_orderkey HAVING sum(l_quantity) > 300"
        " ORDER BY l_orderkey", (dt.date(1993, 6, 1),)),
    "revenue in the select list": (
        "SELECT l_orderkey, sum(l_extendedprice * (1 - l_discount)) AS revenue,"
        " sum(l_quantity) AS q FROM lineitem GROUP BY l_orderkey"
        " HAVING sum(l_quantity) > 300 ORDER BY l_orderkey", None),
}
DATA = Path(tempfile.gettempdir()) / "imp-bench-data"


def _stats(conn: psycopg.Connection[tuple[object, ...]]) -> dict[str, str]:
    return {str(k): str(v) for k, v in conn.execute("IMP SHOW STATS").fetchall()}


def main() -> None:
    with given_or_throwaway(None) as dsn:
        with psycopg.connect(dsn, autocommit=True) as c:
            load_tpch(c, 0.1, DATA)
            pg_extensions.install(c)
        proxy = launch_proxy(dsn, log_level="WARNING")
        try:
            via = psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=proxy.port)
            with psycopg.connect(dsn, autocommit=True) as d, \
                    psycopg.connect(via, autocommit=True) as p:
                for name, (sql, args) in QUERIES.items():
                    for _ in range(4):
                        assert p.execute(sql, args).fetchall() == d.execute(sql, args).fetchall()
                    before = _stats(p)
                    times: dict[str, list[float]] = {"direct": [], "proxy": []}
                    for _ in range(15):
                        for side, conn in (("direct", d), ("proxy", p)):
                            t0 = time.perf_counter()
                            rows = conn.execute(sql, args).fetchall()
                            times[side].append((time.perf_counter() - t0) * 1e3)
                            assert rows
                    after = _stats(p)
                    counters = {k: int(after[k]) - int(before[k]) for k in
                                ("proxy.used", "proxy.passthrough", "proxy.fallbacks")}
                    direct, proxied = (statistics.median(times[s]) for s in ("direct", "proxy"))
                    print(f"{name}: direct {direct:.1f} ms, proxy {proxied:.1f} ms,"
                          f" proxy / direct {direct / proxied:.2f}x faster; {counters}")
        finally:
            proxy.stop()


if __name__ == "__main__":
    main()
