"""A database an older version of the proxy used: the current proxy brings schema ``imp`` up to
date without stalling queries, and an older proxy still running beside it (a rolling upgrade)
cannot make it lose rows. The older schemas are made from the current one by undoing what
the newer versions changed (found with real older proxies, run from git work trees)."""

from __future__ import annotations

from typing import Any

import psycopg

from .conftest import LaunchProxy, scalar, via_proxy, wait_until

HAVING = "SELECT g, sum(v) FROM t GROUP BY g HAVING sum(v) > 5000 ORDER BY g"
GROUPS = "SELECT g, count(*) AS n FROM h GROUP BY g HAVING count(*) > 45 ORDER BY g"


def _rows(dsn: str, q: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(q.encode()).fetchall()


def _decision(proxied: str, q: str) -> str:
    return str(dict(_rows(proxied, f"IMP EXPLAIN {q}"))["decision"])


def _tracked_by_a_proxy(launch: LaunchProxy, direct: str) -> None:
    """Table ``t``, queried through a proxy until its background thread tracks it; then the
    proxy is stopped, as a user stops the old version before starting the new one."""
    with psycopg.connect(direct, autocommit=True) as c:
        c.execute("CREATE TABLE t (g int, v int)")
        c.execute("INSERT INTO t SELECT i % 50, i FROM generate_series(1, 5000) i")
    p = launch(upstream=direct)

    def tracked() -> bool:
        assert _rows(via_proxy(direct, p.port), HAVING) == _rows(direct, HAVING)
        return bool(scalar(direct, "SELECT to_regclass('imp.tracked_tables') IS NOT NULL")) \
            and bool(scalar(direct, "SELECT count(*) FROM imp.tracked_tables"
                                    " WHERE relid = 't'::regclass"))

    assert wait_until(tracked, timeout=30, interval=0.3), "t was never tracked"
    p.stop()


def test_an_upgrade_that_tracks_every_table_afresh_does_not_stall_queries(
        fresh_db: Any, launch: LaunchProxy) -> None:
    """Versions before 5507e9f made imp's event triggers fire on origin only, and their
    catalog had no ``imp.sketches.settings``. The current proxy's first query installed the
    migrations in its prepare, and the DDL guard, made anew, untracked every table: its DROP
    TRIGGER on ``t`` waited for the ACCESS SHARE the client's own wrapping held on ``t``,
    until the 2 s ``lock_timeout``; the install rolled back, and the next query did the same,
    for ever (found by a helper's search of upgrades in session 26: never a sketch, and a
    direct INSERT queued behind the DROP TRIGGER). Now the background thread installs."""
    direct = str(fresh_db())
    _tracked_by_a_proxy(launch, direct)
    with psycopg.connect(direct, autocommit=True) as c:   # the schema such a version left
        for name in ("imp_ddl_end", "imp_ddl_drop", "imp_audit_guard"):
            c.execute(f"ALTER EVENT TRIGGER {name} ENABLE")
        c.execute("ALTER TABLE imp.sketches DROP COLUMN settings")
        c.execute("UPDATE imp.schema_version SET checksum = 'older'")
    p = launch(upstream=direct)
    proxied = via_proxy(direct, p.port)

    def sketched() -> bool:
        assert _rows(proxied, HAVING) == _rows(direct, HAVING)
        return _decision(proxied, HAVING) in ("use", "capture")

    assert wait_until(sketched, timeout=30, interval=0.3), _decision(proxied, HAVING)
    assert scalar(direct, "SELECT count(*) FROM pg_event_trigger WHERE evtenabled = 'A'"
                          " AND evtname LIKE 'imp%%'") == 3
    with psycopg.connect(direct, autocommit=True) as c:
        c.execute("UPDATE t SET v = v + 100000 WHERE g = 3")
    for _ in range(3):
        assert _rows(proxied, HAVING) == _rows(direct, HAVING)


def test_an_older_proxys_collection_beside_the_current_one_loses_no_row(
        fresh_db: Any, launch: LaunchProxy) -> None:
    """A rolling upgrade: the current proxy holds a sketch's state (persisted too); an older
    proxy on the same database drops that sketch (its ``IMP DROP SKETCH`` deletes the
    catalog and state rows) and then collects the audit rows of a later write, calling the
    current ``imp.gc_deltas`` (an older proxy never installs again a schema it knows). The
    watermark that makes the current proxy rebuild such a state was written by the current
    Python code only (found by a helper's search of upgrades in session 26, with real older
    proxies: group 0 missing). The older proxy's statements are replayed here."""
    direct = str(fresh_db())
    with psycopg.connect(direct, autocommit=True) as c:
        c.execute("CREATE TABLE h (id serial PRIMARY KEY, g int NOT NULL, v int NOT NULL)")
        c.execute("INSERT INTO h (g, v) SELECT g, i FROM generate_series(0, 49) g,"
                  " generate_series(1, 40 + g % 20) i")
        c.execute("ANALYZE h")
    p = launch("--library-setting", "state_interval=0.5", upstream=direct)
    proxied = via_proxy(direct, p.port)
    persisted: list[int] = []

    def saved() -> bool:
        assert _rows(proxied, GROUPS) == _rows(direct, GROUPS)
        if scalar(direct, "SELECT to_regclass('imp.ivm_state') IS NOT NULL"):
            persisted.extend(r[0] for r in _rows(
                direct, "SELECT k.id FROM imp.sketches k JOIN imp.ivm_state s"
                        " ON s.sketch_key = k.id::text WHERE k.valid"))
        return bool(persisted)

    assert wait_until(saved, timeout=30, interval=0.3), "the state was never persisted"
    with psycopg.connect(direct, autocommit=True) as c:
        c.execute("DELETE FROM imp.sketches WHERE id = %s", (persisted[0],))
        c.execute("DELETE FROM imp.ivm_state WHERE sketch_key = %s", (str(persisted[0]),))
        c.execute("INSERT INTO h (g, v) SELECT 0, i FROM generate_series(1, 10) i")
    with psycopg.connect(direct, autocommit=True) as c:
        c.execute("SELECT imp.gc_deltas('h'::regclass, pg_current_snapshot())")
    assert _rows(proxied, GROUPS) == _rows(direct, GROUPS)
