"""What session 35 changed on a wrapped query's path, each piece timed alone, alternating
with the session's old form on a throwaway cluster:

* the exit_on_error guard of the wrapping's first round trip on the client's backend (every
  wrapped query): one SELECT reading both settings and turning exit_on_error off (before)
  against ``SHOW exit_on_error; SET LOCAL exit_on_error = off`` (``intercept.GUARD_SETTINGS``
  now), which take no snapshot, so the LOCK after them comes before the transaction's
  snapshot (backslash_quote is read with the export now; one column more, left out here);
* the service transaction's setup (every prepare on a service connection): without and with
  the ``LOCK TABLE … IN ACCESS SHARE MODE NOWAIT`` of the query's tables (``router``).

Run from the checkout's root: ``.venv/bin/python bench/results/wrapping-s35/wrapping_cost.py``
"""

from __future__ import annotations

import statistics
import time

import psycopg

from imp_proxy.embedded import given_or_throwaway as server
from imp_proxy.intercept import BEGIN_SNAPSHOT, GUARD_SETTINGS

ROUNDS = 2000
LOCK = "LOCK TABLE lat IN ACCESS SHARE MODE NOWAIT"
OLD_GUARD = ("SELECT pg_catalog.current_setting('exit_on_error')"
             " OPERATOR(pg_catalog.=) 'on', pg_catalog.current_setting('backslash_quote')"
             " OPERATOR(pg_catalog.=) 'off', pg_catalog.set_config('exit_on_error', 'off',"
             " true)")


def wrapping(c: psycopg.Connection[tuple[object, ...]], new: bool) -> float:
    t0 = time.perf_counter()
    with c.pipeline():
        c.execute(BEGIN_SNAPSHOT[0])
        for statement in GUARD_SETTINGS if new else (OLD_GUARD,):
            c.execute(statement)
        c.execute(LOCK)
        c.execute(BEGIN_SNAPSHOT[1])
        c.execute("ROLLBACK")
    return time.perf_counter() - t0


def setup(c: psycopg.Connection[tuple[object, ...]], snapshot: str, new: bool) -> float:
    statements = ["BEGIN ISOLATION LEVEL REPEATABLE READ",
                  f"SET TRANSACTION SNAPSHOT '{snapshot}'",
                  "SET LOCAL idle_in_transaction_session_timeout = 0",
                  "SET LOCAL lock_timeout = '2s'",
                  "SELECT set_config('search_path', 'public', true)",
                  *([LOCK] if new else []), "SELECT current_setting('TimeZone')"]
    t0 = time.perf_counter()
    cur = c.execute("; ".join(statements))
    while cur.nextset():
        pass
    cur.fetchone()
    elapsed = time.perf_counter() - t0
    c.execute("ROLLBACK")
    return elapsed


def main() -> None:
    with server(None) as dsn, psycopg.connect(dsn, autocommit=True) as c, \
            psycopg.connect(dsn, autocommit=True) as service:
        c.execute("CREATE TABLE lat (id int PRIMARY KEY, g int, v int)")
        c.execute("INSERT INTO lat SELECT i, i % 100, i FROM generate_series(1, 5000) i")
        c.execute("ANALYZE lat")
        times: dict[tuple[str, bool], list[float]] = {}
        for _ in range(ROUNDS):
            for new in (True, False):
                times.setdefault(("wrapping", new), []).append(wrapping(c, new))
        c.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        snapshot = str(c.execute("SELECT pg_export_snapshot()").fetchone()[0])  # type: ignore[index]
        for _ in range(ROUNDS):
            for new in (True, False):
                times.setdefault(("service setup", new), []).append(setup(service, snapshot, new))
        c.execute("ROLLBACK")
        for piece in ("wrapping", "service setup"):
            old = statistics.median(times[(piece, False)]) * 1e6
            now = statistics.median(times[(piece, True)]) * 1e6
            print(f"{piece}: before {old:.1f} µs, after {now:.1f} µs, added {now - old:.1f} µs")


if __name__ == "__main__":
    main()
