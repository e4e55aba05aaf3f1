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
    ("SELECT g, sum(v) FROM plain GROUP BY g HAVING sum(v) > 3",   # not on the path
     "plain is no table in the query's snapshot"),
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


ESCAPE = "SELECT g, sum(v) FROM lk.plain WHERE {w} GROUP BY g HAVING sum(v) > 3"


@pytest.fixture
def own_code(conn: psycopg.Connection[Any], db_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A session with a schema ``own`` of user code (dropped after), on public, own (and
    schema lk of ``conn``)."""
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS citext SCHEMA public")
        c.execute("CREATE SCHEMA own")
        c.execute("CREATE DOMAIN own.dd AS int CHECK (VALUE > 0)")
        c.execute("CREATE TYPE own.mood AS ENUM ('a', 'b')")
        c.execute("CREATE TYPE own.pair AS (a own.dd, b int)")
        c.execute("CREATE TABLE own.feel (g int, v int, e own.mood, t text)")
        c.execute("SET search_path = public, own")
        try:
            yield c
        finally:
            c.execute("RESET search_path")
            c.execute("DROP SCHEMA own CASCADE")


def _reason(c: psycopg.Connection[Any], sql: str) -> str | None:
    return lookup.relations(c, analyse(sql, lenient=True)).reason


@pytest.mark.parametrize(("setup", "where"), [
    ("", "v::own.dd > 0"),                    # a domain's CHECK runs on the cast
    ("", "v::dd > 0"),
    ("", "'a'::own.mood IS NOT NULL"),        # an enum (a user cast may lead there)
    ("", "'(1,2)'::own.pair IS NOT NULL"),    # a composite with a domain field
    ("", "ARRAY[v]::own.dd[] IS NOT NULL"),   # an array of a domain
    ("CREATE DOMAIN pg_temp.td AS int", "v::td > 0"),
    # a whitelisted name resolves to the role's function through int -> domain
    ("CREATE FUNCTION own.lower(x own.dd) RETURNS bool LANGUAGE sql AS 'SELECT true'",
     "lower(v)"),
    ("CREATE DOMAIN pg_temp.td AS int;"
     " CREATE FUNCTION pg_temp.lower(x pg_temp.td) RETURNS bool LANGUAGE sql AS 'SELECT true'",
     "lower(v)"),
    ("CREATE FUNCTION own.lower(x own.dd[]) RETURNS bool LANGUAGE sql AS 'SELECT true'",
     "lower(ARRAY[v])"),
    # an operator on a domain operand
    ("CREATE FUNCTION own.opf(x own.dd, y int) RETURNS bool LANGUAGE sql AS 'SELECT true';"
     " CREATE OPERATOR own.=== (LEFTARG = own.dd, RIGHTARG = int, FUNCTION = own.opf)",
     "v === 1"),
    # a role's SQL function on any user type (an untyped literal becomes one)
    ("CREATE FUNCTION own.sum(x public.citext) RETURNS int LANGUAGE sql AS 'SELECT 1'",
     "v > 0"),
    ("CREATE FUNCTION own.agg_step(s int, x own.mood) RETURNS int LANGUAGE sql"
     " AS 'SELECT 1'; CREATE AGGREGATE own.sum(own.mood) (SFUNC = own.agg_step, STYPE = int)",
     "v > 0"),
    # a C function in the client's temporary schema (never found by the client itself)
    ("CREATE FUNCTION pg_temp.lower(x public.citext) RETURNS text LANGUAGE internal"
     " AS 'lower'", "lower(v::text) = 'x'"),
    # a C function on a base type an implicit cast leads to
    ("CREATE TYPE own.num; CREATE FUNCTION own.num_in(cstring) RETURNS own.num"
     " LANGUAGE internal IMMUTABLE STRICT AS 'int4in';"
     " CREATE FUNCTION own.num_out(own.num) RETURNS cstring LANGUAGE internal IMMUTABLE"
     " STRICT AS 'int4out';"
     " CREATE TYPE own.num (INPUT = own.num_in, OUTPUT = own.num_out, LIKE = int4);"
     " CREATE CAST (int AS own.num) WITHOUT FUNCTION AS IMPLICIT;"
     " CREATE FUNCTION own.lower(x own.num) RETURNS bool LANGUAGE internal AS 'int4eq'",
     "lower(v)"),
])
def test_user_code_a_query_may_run_passes_through(own_code: psycopg.Connection[Any],
                                                  setup: str, where: str) -> None:
    """The capture runs the query's SQL as the service role: no code of a role's own may
    run on the way — a domain's CHECK, a function or operator a value reaches through a
    domain, an implicit cast or a literal, anything in the client's temporary schema."""
    assert _reason(own_code, ESCAPE.format(w="v > 0")) is None
    for statement in filter(None, setup.split(";")):
        own_code.execute(statement)
    got = _reason(own_code, ESCAPE.format(w=where))
    assert got is not None and ": " in got


@pytest.mark.parametrize("context", ["IMPLICIT", "ASSIGNMENT", "EXPLICIT"])
def test_a_user_cast_of_a_query_type_passes_through(own_code: psycopg.Connection[Any],
                                                     context: str) -> None:
    """``sum(e)`` on an enum with ``CREATE CAST (mood AS int) WITH FUNCTION … AS IMPLICIT``
    runs the cast's function unasked."""
    sql = "SELECT g, sum(v) FROM own.feel WHERE e IS NOT NULL GROUP BY g"
    assert _reason(own_code, sql) is None
    own_code.execute("CREATE FUNCTION own.m2i(x own.mood) RETURNS int LANGUAGE sql"
                     " AS 'SELECT 1'")
    own_code.execute(f"CREATE CAST (own.mood AS int) WITH FUNCTION own.m2i(own.mood)"
                     f" AS {context}" if context != "EXPLICIT" else
                     "CREATE CAST (own.mood AS int) WITH FUNCTION own.m2i(own.mood)")
    got = _reason(own_code, sql)
    assert got is not None and "own.m2i" in got


@pytest.mark.parametrize("sql", [
    "SELECT g, sum(v) FROM own.feel WHERE v > 0 GROUP BY g HAVING max(v) > 3",
    "SELECT g, count(*) FROM own.feel WHERE lower(t) = 'x' GROUP BY g",
    "SELECT g, count(*) FROM own.feel WHERE e = 'a' GROUP BY g",    # an enum column, no cast
])
def test_built_in_code_and_an_extensions_base_type_pass(own_code: psycopg.Connection[Any],
                                                        sql: str) -> None:
    """Queries of built-in types keep their sketches with citext's schema on the path (a
    base type no implicit cast leads to, its functions C) and an enum column."""
    assert _reason(own_code, sql) is None


def test_a_citext_column_compared_with_text_off_the_path(own_code: psycopg.Connection[Any]
                                                         ) -> None:
    """citext's schema off the path: its column compared with text, and a cast to it, run
    only PostgreSQL's code (its casts are C, no implicit one leads to it); on the path its
    own ``=`` is found, as before."""
    own_code.execute("CREATE SCHEMA own_ext")
    try:
        own_code.execute("ALTER EXTENSION citext SET SCHEMA own_ext")
        own_code.execute("ALTER TABLE own.feel ADD COLUMN c own_ext.citext")
        sql = "SELECT g, count(*) FROM own.feel WHERE c = 'foo' GROUP BY g"
        assert _reason(own_code, sql) is None
        sql = "SELECT g, count(*) FROM own.feel WHERE t::own_ext.citext = 'foo' GROUP BY g"
        assert _reason(own_code, sql) is None
        own_code.execute("SET search_path = public, own, own_ext")
        got = _reason(own_code, sql)   # citext's own = is found: not the built-in one
        assert got is not None and "built-in" in got
    finally:
        own_code.execute("ALTER EXTENSION citext SET SCHEMA public")
        own_code.execute("DROP SCHEMA own_ext CASCADE")


def test_search_path_schemas_read_back_what_postgresql_quoted(
        conn: psycopg.Connection[Any]) -> None:
    """The schemas of an effective search_path, as PostgreSQL's ``quote_ident`` printed
    them: names with commas, spaces, quotes, capitals and non-ASCII letters come back
    whole, so the service connection compares the very schemas (a schema ``"a, b"`` is not
    ``a`` and ``b``)."""
    names = ["public", "a, b", 'say "hi"', "Tenant", "ünï", "x$1", "select"]
    with conn.transaction(force_rollback=True):
        for n in names[1:]:
            conn.execute(psycopg.sql.SQL("CREATE SCHEMA {}").format(psycopg.sql.Identifier(n)))
        conn.execute("SELECT set_config('search_path', %s, true)",
                     (", ".join(psycopg.sql.Identifier(n).as_string(conn) for n in names),))
        row = conn.execute("SELECT " + lookup.EFFECTIVE_SEARCH_PATH + ", current_schemas(true)"
                           ).fetchone()
        assert row is not None
        assert lookup.search_path_schemas(row[0]) == list(row[1])
        assert list(row[1])[-len(names) - 1:] == ["pg_catalog", *names]   # after any pg_temp
    assert lookup.search_path_schemas("") == []
    for bad in ('"open', "a,b", "a, ", ", a", 'a "b"'):
        assert lookup.search_path_schemas(bad) is None, bad
