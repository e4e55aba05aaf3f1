"""What session 36's check of the manager's own DDL costs, against a ``SELECT 1`` round trip
measured side by side on the same connection (interleaved, medians).

``user_triggers_ran`` runs once per capture (before the capture query) and whenever the
manager records one of its transactions as catalog-only; it reads ``pg_event_trigger`` only
in a transaction where the manager ran DDL (``note_ddl``, one more statement before it).

Run: ``.venv/bin/python bench/results/selfwrites-s36/selfwrites_cost.py``
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import psycopg

from imp_proxy.embedded import given_or_throwaway
from sketches import freshness

ROUNDS = 2000


def _median_us(cases: dict[str, Callable[[], object]]) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(ROUNDS):
        for name, call in cases.items():
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e6 for k, v in times.items()}


def main() -> None:
    with given_or_throwaway(None) as dsn, psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE sw_log (obj text)")
        conn.execute("CREATE FUNCTION sw_log_ddl() RETURNS event_trigger LANGUAGE plpgsql"
                     " AS $$ BEGIN INSERT INTO sw_log VALUES ('x'); END $$")
        cases: dict[str, Callable[[], object]] = {
            "SELECT 1": lambda: conn.execute("SELECT 1").fetchone(),
            "user_triggers_ran": lambda: freshness.user_triggers_ran(conn),
        }
        quiet = _median_us(cases)
        freshness.note_ddl(conn)
        flagged = _median_us(cases)
        conn.execute("CREATE EVENT TRIGGER sw_log_ddl ON ddl_command_end"
                     " EXECUTE FUNCTION sw_log_ddl()")
        flagged_trigger = _median_us(cases)
        conn.rollback()
    print(f"{ROUNDS} interleaved rounds; medians")
    print("| check | no DDL of the manager | DDL, no user event trigger"
          " | DDL and a user event trigger |")
    print("|---|---:|---:|---:|")
    for name in cases:
        cells = [f"{r[name]:.0f} µs ({r[name] / r['SELECT 1']:.2f}×)"
                 for r in (quiet, flagged, flagged_trigger)]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
