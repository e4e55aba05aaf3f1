"""What session 36's checks of the manager's own writes cost, against a ``SELECT 1`` round trip
measured side by side on the same connection (interleaved, medians).

* ``wrote_tables`` runs once per capture (before the capture query): is any row of the
  query's tables written by the capture's own transaction?
* ``wrote_user_data`` runs whenever the manager records one of its transactions as
  catalog-only; it reads the transaction's row counts only while a user's event trigger is
  enabled.

Run: ``.venv/bin/python bench/results/selfwrites-s36/selfwrites_cost.py``
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import psycopg

from imp_proxy.embedded import given_or_throwaway
from sketches import freshness

TABLES = 500
ROUNDS = 2000


def _median_us(conn: psycopg.Connection[object], cases: dict[str, Callable[[], object]]
               ) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(ROUNDS):
        for name, call in cases.items():
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e6 for k, v in times.items()}


def main() -> None:
    with given_or_throwaway(None) as dsn, psycopg.connect(dsn) as conn:
        for i in range(TABLES):
            conn.execute(f"CREATE TABLE sw_{i} (a int)")
        conn.execute("CREATE TABLE sw_log (obj text)")
        conn.execute("INSERT INTO sw_0 VALUES (1)")   # a write of this transaction
        relid = conn.execute("SELECT 'sw_1'::regclass::oid::int").fetchone()
        assert relid is not None
        cases: dict[str, Callable[[], object]] = {
            "SELECT 1": lambda: conn.execute("SELECT 1").fetchone(),
            "wrote_tables (1 table)": lambda: freshness.wrote_tables(conn, [relid[0]]),
            "wrote_user_data": lambda: freshness.wrote_user_data(conn),
        }
        print(f"{TABLES + 1} user tables, one written in the transaction; {ROUNDS} rounds")
        plain = _median_us(conn, cases)
        conn.execute("CREATE FUNCTION sw_log_ddl() RETURNS event_trigger LANGUAGE plpgsql"
                     " AS $$ BEGIN INSERT INTO sw_log VALUES ('x'); END $$")
        conn.execute("CREATE EVENT TRIGGER sw_log_ddl ON ddl_command_end"
                     " EXECUTE FUNCTION sw_log_ddl()")
        with_trigger = _median_us(conn, cases)
        conn.rollback()
    print("| check | no user event trigger | a user event trigger |")
    print("|---|---:|---:|")
    for name in cases:
        print(f"| {name} | {plain[name]:.0f} µs ({plain[name] / plain['SELECT 1']:.2f}×)"
              f" | {with_trigger[name]:.0f} µs"
              f" ({with_trigger[name] / with_trigger['SELECT 1']:.2f}×) |")


if __name__ == "__main__":
    main()
