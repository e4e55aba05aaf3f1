"""What a declined capture costs a query through the proxy: 60 small HAVING queries (about
2.5 ms each, an index on ``g``), each with a new WHERE constant, directly, through the proxy
with sketches on (after four captures every one is declined: ``unreused_captures``) and
through the proxy with ``IMP SET enabled = off``, in turn.

``python bench/results/unreused-s30/decision_cost.py`` from a checkout's root (a throwaway
PostgreSQL 15 and this tree's proxy); prints the medians of queries 11–60 in ms and the
``IMP EXPLAIN`` reason of a further query.
"""

from __future__ import annotations

import statistics
import time

import psycopg
from changing_literals import served  # the sibling script's set-up (run by path: its folder)

QUERY = ("SELECT g, sum(v) FROM t WHERE day >= {c} AND g < 20 GROUP BY g HAVING sum(v) > 10"
         " ORDER BY g")


def main() -> None:
    with served() as (dsn, via):
        with psycopg.connect(via, autocommit=True) as p, \
                psycopg.connect(via, autocommit=True) as off, \
                psycopg.connect(dsn, autocommit=True) as d:
            off.execute("IMP SET enabled = off")
            times: dict[str, list[float]] = {"direct": [], "declined": [], "off": []}
            for i in range(60):
                q = QUERY.format(c=i + 1)
                for name, conn in (("direct", d), ("declined", p), ("off", off)):
                    t0 = time.perf_counter()
                    conn.execute(q).fetchall()
                    times[name].append((time.perf_counter() - t0) * 1e3)
            print({k: round(statistics.median(v[10:]), 2) for k, v in times.items()})
            explain = {str(k): v for k, v in
                       p.execute("IMP EXPLAIN " + QUERY.format(c=999)).fetchall()}
            print(explain["reason"])


if __name__ == "__main__":
    main()
