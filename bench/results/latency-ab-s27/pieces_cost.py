"""What session 27 added to a wrapped query's path, each piece timed alone, alternating with
the same work without it on a throwaway cluster:

* the exit_on_error guard (``intercept.GUARD_SETTINGS``), one more statement in the
  wrapping's first round trip on the client's backend (every wrapped query);
* the search for foreign or temporary descendants (``lookup._UNSEEN_DESCENDANT``) in the
  relations check that runs once per new snapshot (after a write), for a table without
  children.

Run from the checkout's root: ``.venv/bin/python bench/results/latency-ab-s27/pieces_cost.py``
"""

from __future__ import annotations

import statistics
import time

import psycopg
from psycopg import sql

import sketches.lookup as lookup_module
from imp_proxy.embedded import given_or_throwaway as server
from imp_proxy.intercept import BEGIN_SNAPSHOT
from sketches import lookup
from sketches.sql import analyse

ROUNDS = 2000
GUARD_SETTINGS = ("SELECT pg_catalog.current_setting('exit_on_error')"
                  " OPERATOR(pg_catalog.=) 'on', pg_catalog.current_setting('backslash_quote')"
                  " OPERATOR(pg_catalog.=) 'off', pg_catalog.set_config('exit_on_error', 'off',"
                  " true)")
"""The guard as sessions 27–34 sent it (``intercept.GUARD_SETTINGS`` is two utility statements
since session 35: bench/results/wrapping-s35)."""


def guard(c: psycopg.Connection[tuple[object, ...]], with_it: bool) -> float:
    t0 = time.perf_counter()
    with c.pipeline():
        c.execute(BEGIN_SNAPSHOT[0])
        if with_it:
            c.execute(GUARD_SETTINGS)
        c.execute("LOCK TABLE lat IN ACCESS SHARE MODE NOWAIT")
        c.execute(BEGIN_SNAPSHOT[1])
        c.execute("ROLLBACK")
    return time.perf_counter() - t0


def main() -> None:
    with server(None) as dsn, psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE lat (id int PRIMARY KEY, g int, v int)")
        c.execute("INSERT INTO lat SELECT i, i % 100, i FROM generate_series(1, 5000) i")
        c.execute("ANALYZE lat")
        times: dict[tuple[str, bool], list[float]] = {}
        for _ in range(ROUNDS):
            for with_it in (True, False):
                times.setdefault(("guard", with_it), []).append(guard(c, with_it))
        analysis = analyse("SELECT g, sum(v) FROM lat GROUP BY g HAVING sum(v) > 5",
                           lookup.resolver(c))
        full = lookup_module._RELATIONS
        without = sql.SQL(full.as_string(None).replace(lookup_module._UNSEEN_DESCENDANT,
                                                       "false"))
        for _ in range(ROUNDS // 5):
            for with_it in (True, False):
                lookup_module._RELATIONS = full if with_it else without
                lookup_module._relations_query.cache_clear()
                lookup.relations(c, analysis)   # prepared once per text
                t0 = time.perf_counter()
                for _ in range(5):
                    lookup.relations(c, analysis)
                times.setdefault(("descendants", with_it), []).append(
                    (time.perf_counter() - t0) / 5)
        lookup_module._RELATIONS = full
        for piece in ("guard", "descendants"):
            on = statistics.median(times[(piece, True)]) * 1e6
            off = statistics.median(times[(piece, False)]) * 1e6
            print(f"{piece}: without {off:.1f} µs, with {on:.1f} µs, added {on - off:.1f} µs")


if __name__ == "__main__":
    main()
