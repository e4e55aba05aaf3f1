"""What one ``compare_cost`` verdict costs: :func:`sketches.worth.compare` (two EXPLAINs) of a
small HAVING query and its instrumented text, 300 rounds, each in its own REPEATABLE READ
transaction as the manager's prepare runs it.

``python bench/results/worth-s29/verdict_cost.py`` from a checkout's root (a throwaway
PostgreSQL 15); prints the median and 90th percentile in ms.
"""

from __future__ import annotations

import statistics
import time

import psycopg

from imp_proxy.embedded import given_or_throwaway
from sketches.worth import compare

QUERY = "SELECT g, sum(v) FROM lt GROUP BY g HAVING sum(v) > $1"
INSTRUMENTED = "SELECT g, sum(v) FROM lt WHERE g >= 3 AND g < 4 GROUP BY g HAVING sum(v) > $1"


def main() -> None:
    with given_or_throwaway(None) as dsn, psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE lt AS SELECT i AS id, i % 50 AS g, i % 97 AS v"
                  " FROM generate_series(1, 5000) i ORDER BY i % 50")
        c.execute("ANALYZE lt")
        times = []
        for i in range(300):
            c.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            t0 = time.perf_counter()
            verdict = compare(c, QUERY, INSTRUMENTED, [4900 + i % 7])
            times.append((time.perf_counter() - t0) * 1e3)
            c.execute("COMMIT")
        print(f"verdict: median {statistics.median(times):.3f} ms, p90 "
              f"{sorted(times)[269]:.3f} ms; pays {verdict.pays}")


if __name__ == "__main__":
    main()
