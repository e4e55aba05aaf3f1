"""sketches.lookup against the real PostgreSQL: which queries depend on the role that runs
them (row-level security on any joined table, a view), read in one statement."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from sketches import lookup
from sketches.sql import analyse


@pytest.fixture(scope="module")
def conn(db_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("CREATE SCHEMA IF NOT EXISTS lk")
        c.execute("CREATE TABLE lk.plain (id int, g int, v int)")
        c.execute('CREATE TABLE lk."Guarded" (id int, pid int, w int)')
        c.execute('ALTER TABLE lk."Guarded" ENABLE ROW LEVEL SECURITY')
        c.execute("CREATE VIEW lk.shown AS SELECT id, g, v FROM lk.plain")
        c.execute("CREATE TYPE lk.mood AS ENUM ('a', 'b')")
        c.execute("CREATE DOMAIN lk.pint AS int")
        c.execute("CREATE DOMAIN lk.stamp AS timestamptz")
        c.execute("CREATE TYPE lk.pair AS (a int, t timestamp)")
        yield c
        c.execute("DROP SCHEMA lk CASCADE")


@pytest.mark.parametrize(("sql", "verdict"), [
    ("SELECT g, sum(v) FROM lk.plain GROUP BY g HAVING sum(v) > 3", None),
    ('SELECT p.g, sum(q.w) FROM lk.plain p, lk."Guarded" q WHERE p.id = q.pid GROUP BY p.g'
     " HAVING sum(q.w) > 3", "Guarded has row-level security"),
    ('SELECT q.pid, count(*) FROM lk."Guarded" q, lk.plain p WHERE p.id = q.pid'
     " GROUP BY q.pid HAVING count(*) > 1", "Guarded has row-level security"),
    ("SELECT g, sum(v) FROM lk.shown GROUP BY g HAVING sum(v) > 3", "shown is a view"),
    ("SELECT g, sum(v) FROM plain GROUP BY g HAVING sum(v) > 3", None),  # not on the path
])
def test_role_dependent(conn: psycopg.Connection[Any], sql: str, verdict: str | None) -> None:
    got = lookup.relations(conn, analyse(sql, lenient=True)).reason
    assert got == verdict if verdict is None else got is not None and got.startswith(verdict)


def test_role_dependent_once_search_path_finds_the_table(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SET search_path = lk, public")
    try:
        sql = "SELECT g, sum(v) FROM shown GROUP BY g HAVING sum(v) > 3"
        got = lookup.relations(conn, analyse(sql, lenient=True)).reason
        assert got is not None and got.startswith("shown is a view")
    finally:
        conn.execute("RESET search_path")


def test_role_dependent_follows_the_catalog_and_search_path_as_they_change(
        conn: psycopg.Connection[Any]) -> None:
    """The check is a prepared statement kept across calls: each call must still read the
    catalog and resolve names as they are now (RLS switched on later, a search_path change
    that finds another table of the same name, a non-ASCII quoted name)."""
    conn.execute('CREATE TABLE lk."Größe ""x""" (id int, g int)')
    conn.execute("CREATE TABLE lk2_plain (g int, v int)")
    try:
        named = analyse('SELECT g, count(*) FROM lk."Größe ""x""" GROUP BY g'
                        " HAVING count(*) > 1", lenient=True)
        bare = analyse("SELECT g, sum(v) FROM lk2_plain GROUP BY g HAVING sum(v) > 3",
                       lenient=True)
        for _ in range(7):   # past PostgreSQL's five custom plans
            assert lookup.relations(conn, named).reason is None
            assert lookup.relations(conn, bare).reason is None
        conn.execute('ALTER TABLE lk."Größe ""x""" ENABLE ROW LEVEL SECURITY')
        got = lookup.relations(conn, named).reason
        assert got is not None and got.startswith('Größe "x" has row-level security')
        conn.execute("CREATE VIEW lk.lk2_plain AS SELECT 1 AS g, 2 AS v")
        conn.execute("SET search_path = lk, public")
        got = lookup.relations(conn, bare).reason   # the view now comes first on the path
        assert got is not None and got.startswith("lk2_plain is a view")
    finally:
        conn.execute("RESET search_path")
        conn.execute('DROP TABLE lk."Größe ""x"""')
        conn.execute("DROP VIEW IF EXISTS lk.lk2_plain")
        conn.execute("DROP TABLE lk2_plain")


def test_relations_name_the_tables_the_session_resolves(conn: psycopg.Connection[Any]) -> None:
    """Each table's oid and schema as this session resolves it — another schema first on the
    path gives another oid; a temporary table of the session is refused, because another
    session (the proxy's service connection) cannot read its rows."""
    query = analyse("SELECT g, sum(v) FROM plain GROUP BY g HAVING sum(v) > 3", lenient=True)
    conn.execute("CREATE TABLE public.plain (id int, g int, v int)")
    try:
        on_public = lookup.relations(conn, query)
        assert on_public.reason is None and on_public.names == (("public", "plain"),)
        conn.execute("SET search_path = lk, public")
        on_lk = lookup.relations(conn, query)
        assert on_lk.names == (("lk", "plain"),) and on_lk.oids != on_public.oids
        conn.execute("CREATE TEMP TABLE plain (id int, g int, v int)")
        temp = lookup.relations(conn, query)
        assert temp.reason is not None and "temporary table" in temp.reason
        path = conn.execute("SELECT " + lookup.EFFECTIVE_SEARCH_PATH).fetchone()
        assert path is not None and path[0].startswith("pg_temp_")
    finally:
        conn.execute("DROP TABLE IF EXISTS pg_temp.plain")
        conn.execute("RESET search_path")
        conn.execute("DROP TABLE public.plain")


@pytest.mark.parametrize(("sql", "free"), [
    ("SELECT g, sum(v) FROM lk.mixed GROUP BY g HAVING sum(v) > 3", True),
    ("SELECT g, count(*) FROM lk.mixed WHERE m = 'a' AND p > 3 AND n <> 'x' AND j IS NOT NULL"
     " GROUP BY g", True),
    ("SELECT g, count(*) FROM lk.mixed WHERE n::int > 3 GROUP BY g", True),
    ("SELECT g, count(*) FROM lk.mixed WHERE ts > '2020-01-01' GROUP BY g", False),
    ("SELECT g, max(d) FROM lk.mixed GROUP BY g", False),
    ("SELECT g, count(*) FROM lk.mixed GROUP BY g HAVING max(dd) IS NOT NULL", False),
    ("SELECT g, count(*) FROM lk.mixed WHERE da IS NULL GROUP BY g", False),
    ("SELECT g, count(*) FROM lk.mixed WHERE iv IS NULL GROUP BY g", False),
    ("SELECT g, count(*) FROM lk.mixed WHERE tr IS NULL GROUP BY g", False),
    ("SELECT g, count(*) FROM lk.mixed WHERE c IS NULL GROUP BY g", False),
    ("SELECT g, count(*) FROM lk.mixed WHERE n::date IS NULL GROUP BY g", False),
    ("SELECT g, count(*) FROM lk.mixed WHERE n = interval '1 day'::text GROUP BY g", False),
    ("SELECT * FROM lk.mixed ORDER BY g LIMIT 3", False),
])
def test_settings_free_queries_read_no_date_time_or_interval(
        conn: psycopg.Connection[Any], sql: str, free: bool) -> None:
    """A query means the same whatever the session's TimeZone, DateStyle and IntervalStyle
    when no column it reads and no cast it makes is of a date, time, interval, range or
    composite type (through a domain or an array); columns it does not read do not count."""
    conn.execute("CREATE TABLE IF NOT EXISTS lk.mixed (g int, v numeric, n text, j jsonb,"
                 " m lk.mood, p lk.pint, ts timestamptz, d date, dd lk.stamp, da date[],"
                 " iv interval, tr tstzrange, c lk.pair)")
    assert lookup.relations(conn, analyse(sql, lookup.resolver(conn))).settings_free is free
