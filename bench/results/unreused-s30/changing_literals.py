"""Sketchable queries whose WHERE constant changes, directly and through the proxy, side by
side in one run, with the manager's ``unreused_captures`` off (0: every new constant is
captured, the earlier behaviour) and on (session 30).

``python bench/results/unreused-s30/changing_literals.py`` from a checkout's root: a
throwaway PostgreSQL 15 and this tree's proxy; ``t`` holds 1M rows (2,000 groups stored in
order, ``day`` 0–999 spread over every group). Each workload runs 40 queries, each directly
and through the proxy (alternating which goes first), and prints the sum of each side's
times, their ratio (direct / proxied: above 1 the proxy is faster), the decisions the proxy
made (``IMP SHOW STATS`` before and after) and whether every answer matched; also the ratio
of queries 9–40 alone (after the captures the setting allows). The settings'
workloads use their own table alias, so each starts on a template of its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from bench.proxy_process import proxied
from imp_proxy.embedded import given_or_throwaway

Conn = psycopg.Connection[Any]
TABLES = (
    "CREATE TABLE t (id int PRIMARY KEY, g int NOT NULL, day int NOT NULL, v int NOT NULL)",
    "INSERT INTO t SELECT i, i % 2000, (i * 7919::bigint) % 1000, (i * 37) % 1000"
    " FROM generate_series(1, 1000000) i ORDER BY i % 2000",
    "CREATE INDEX ON t (g)",
    "VACUUM ANALYZE t",
)
QUERY = ("SELECT {a}.g, sum({a}.v) FROM t AS {a} WHERE {a}.day >= {day} GROUP BY {a}.g"
         " HAVING sum({a}.v) > 497000 - 497 * {day} ORDER BY {a}.g")
WORKLOADS = {
    "a new constant each query": lambda i: 1 + i,
    "three constants in turn": lambda i: 1 + i % 3,
}
QUERIES = 40
LATE_FROM = 8
STATS = ("proxy.captured", "proxy.used", "proxy.passthrough", "captures_declined")


def timed(conn: Conn, q: str) -> tuple[float, list[tuple[Any, ...]]]:
    t0 = time.perf_counter()
    rows = [tuple(r) for r in conn.execute(q).fetchall()]
    return (time.perf_counter() - t0) * 1e3, rows


def stats(p: Conn) -> dict[str, int]:
    rows = dict(p.execute("IMP SHOW STATS").fetchall())
    return {k: int(float(rows.get(k, 0))) for k in STATS}


def workload(p: Conn, d: Conn, name: str, alias: str, setting: int) -> None:
    p.execute(f"IMP SET unreused_captures = {setting}")
    before = stats(p)
    direct = proxied = 0.0
    late_direct = late_proxied = 0.0   # after the first LATE_FROM queries
    same = 0
    for i in range(QUERIES):
        q = QUERY.format(a=alias, day=WORKLOADS[name](i))
        sides = ((d, "d"), (p, "p")) if i % 2 == 0 else ((p, "p"), (d, "d"))
        answers = {}
        for conn, side in sides:
            ms, answers[side] = timed(conn, q)
            if side == "d":
                direct += ms
                late_direct += ms if i >= LATE_FROM else 0.0
            else:
                proxied += ms
                late_proxied += ms if i >= LATE_FROM else 0.0
        same += answers["d"] == answers["p"]
    after = stats(p)
    moved = ", ".join(f"{k} {after[k] - before[k]}" for k in STATS)
    print(f"unreused_captures={setting} | {name} | direct {direct:.0f} ms | proxy "
          f"{proxied:.0f} ms | {direct / proxied:.2f}x | queries {LATE_FROM + 1}-{QUERIES}: "
          f"{late_direct / late_proxied:.2f}x | same {same}/{QUERIES} | {moved}",
          flush=True)


@contextmanager
def served() -> Iterator[tuple[str, str]]:
    """A throwaway PostgreSQL with the table loaded, and the proxy in front of it: (direct
    DSN, DSN through the proxy). Also ``decision_cost.py``'s."""
    with given_or_throwaway(None) as dsn:
        with psycopg.connect(dsn, autocommit=True) as c:
            for stmt in TABLES:
                c.execute(stmt)
        with proxied(dsn) as via:
            yield dsn, via


def main() -> None:
    with served() as (dsn, via):
        with psycopg.connect(via, autocommit=True) as p, \
                psycopg.connect(dsn, autocommit=True) as d:
            n = 0
            for setting in (0, 4, 0, 4):
                for name in WORKLOADS:
                    n += 1
                    workload(p, d, name, f"w{n}", setting)


if __name__ == "__main__":
    main()
