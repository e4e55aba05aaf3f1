"""Lookups in the user database's catalog: tables through search_path, their columns and
indexes. Used by the manager to resolve queries and choose sketch attributes."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import psycopg
from psycopg import sql as psql

from sketches import pipelined
from sketches.safety import SafeAttribute
from sketches.sql import ColumnRef, ColumnResolver, QueryAnalysis, raising
from sketches.typeoids import NUMERIC

_ROLE_FUNCTIONS = re.compile(
    r"\b(current_user|session_user|current_role|user|current_setting|pg_has_role"
    r"|has_\w+_privilege|row_security_active)\b", re.IGNORECASE)


def resolver(conn: psycopg.Connection[Any]) -> ColumnResolver:
    """Column lists from the catalog, resolved through the connection's search_path."""
    cache: dict[tuple[str | None, str], list[str] | None] = {}

    def columns(schema: str | None, table: str) -> list[str] | None:
        key = (schema, table)
        if key not in cache:
            resolved = resolve_table(conn, schema, table)
            if resolved is None:
                cache[key] = None
            else:
                rows = conn.execute(
                    "SELECT a.attname FROM pg_attribute a WHERE a.attrelid ="
                    " (quote_ident(%s) || '.' || quote_ident(%s))::regclass"
                    " AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
                    resolved).fetchall()
                cache[key] = [r[0] for r in rows]
        return cache[key]

    return columns


def resolve_table(conn: psycopg.Connection[Any], schema: str | None,
                   table: str) -> tuple[str, str] | None:
    """``(schema, table)`` of a base table (or partitioned table / matview) as the query
    names it, resolved through search_path; None for views and unknown names."""
    name = psql.SQL("quote_ident(%s)") if schema is None else \
        psql.SQL("quote_ident(%s) || '.' || quote_ident(%s)")
    args: tuple[str, ...] = (table,) if schema is None else (schema, table)
    row = conn.execute(
        psql.SQL("SELECT n.nspname, c.relname, c.relkind FROM pg_class c"
                 " JOIN pg_namespace n ON n.oid = c.relnamespace"
                 " WHERE c.oid = to_regclass({})").format(name), args).fetchone()
    if row is None or row[2] not in ("r", "p", "m"):
        return None
    return str(row[0]), str(row[1])


def column_types(conn: psycopg.Connection[Any],
                 columns: Sequence[tuple[str, str, str]]) -> list[int | None]:
    """The type oid of each ``(schema, table, column)`` (None: no such column)."""
    return [oid for oid, _mod in column_types_and_mods(conn, columns)]


def column_types_and_mods(conn: psycopg.Connection[Any], columns: Sequence[tuple[str, str, str]]
                          ) -> list[tuple[int | None, int]]:
    """The type oid and ``atttypmod`` of each ``(schema, table, column)`` (None and -1: no
    such column)."""
    if not columns:
        return []
    rows = conn.execute(
        "SELECT a.atttypid, a.atttypmod FROM unnest(%s::text[], %s::text[], %s::text[])"
        " WITH ORDINALITY AS u(s, t, c, i) LEFT JOIN pg_catalog.pg_attribute AS a"
        " ON a.attrelid = to_regclass(quote_ident(u.s) || '.' || quote_ident(u.t))"
        " AND a.attname = u.c AND NOT a.attisdropped ORDER BY u.i",
        ([c[0] for c in columns], [c[1] for c in columns], [c[2] for c in columns])).fetchall()
    return [(None, -1) if r[0] is None else (int(r[0]), int(r[1])) for r in rows]


def raising_catalog(conn: psycopg.Connection[Any], analysis: QueryAnalysis) -> raising.Catalog:
    """What :func:`sketches.sql.raising.refusal` reads from the catalog for ``analysis``,
    resolved through the connection's search_path (no round trip when it reads nothing)."""
    names = raising.named_types(analysis)
    categories: dict[str, str | None] = {}
    if names:
        rows = conn.execute("SELECT u.n, y.typcategory FROM unnest(%s::text[]) AS u(n)"
                            " LEFT JOIN pg_catalog.pg_type AS y ON y.oid = to_regtype(u.n)",
                            (list(names),)).fetchall()
        categories = {str(n): None if c is None else str(c) for n, c in rows}
    types, mods = _types_of(conn, analysis, raising.typed_columns(analysis))
    digits = {c: d for c, mod in mods.items()
              if types[c] == NUMERIC and (d := raising.numeric_digits(mod)) is not None}
    return raising.Catalog(types, categories, digits)


def _types_of(conn: psycopg.Connection[Any], analysis: QueryAnalysis,
              columns: Sequence[ColumnRef]
              ) -> tuple[dict[ColumnRef, int | None], dict[ColumnRef, int]]:
    """The type oid of each of ``columns`` (None: not a base table's column), and the
    ``atttypmod`` of each base table's column."""
    tables = {c.table: resolve_table(conn, analysis.tables[c.table].schema,
                                     analysis.tables[c.table].name) for c in columns}
    named = [(c, (*name, c.column)) for c in columns if (name := tables[c.table]) is not None]
    found = dict(zip((c for c, _n in named), column_types_and_mods(conn, [n for _c, n in named]),
                     strict=True))
    return ({**dict.fromkeys(columns), **{c: oid for c, (oid, _m) in found.items()}},
            {c: mod for c, (_o, mod) in found.items()})


EFFECTIVE_SEARCH_PATH = ("pg_catalog.array_to_string(ARRAY(SELECT pg_catalog.quote_ident(s)"
                         " FROM pg_catalog.unnest(pg_catalog.current_schemas(true)) AS s), ', ')")
"""SQL for the schemas a session's unqualified names resolve through, as a search_path value:
``$user`` expanded, schemas that do not exist or lack USAGE dropped, the session's temporary
schema and pg_catalog where they are searched. Set on another session, it resolves the same
names to the same relations; the setting's own text (``"$user", public``) does not. Every
function qualified: it runs on the client's session, whose own ``current_schemas`` or
``quote_ident`` (an exact match for ``name``, found even after pg_catalog) had told the
proxy another path (found by a helper's regression search: the capture resolved names
elsewhere than the client's query, which then lost groups)."""


_PATH_ELEMENT = re.compile(r'"(?:[^"]|"")*"|[^",\s]+')


def search_path_schemas(path: str) -> list[str] | None:
    """The schema names of a :data:`EFFECTIVE_SEARCH_PATH` value (``quote_ident`` output
    joined by ``, ``), for a comparison with another session's ``current_schemas(true)``;
    None for a text that is no such value."""
    names: list[str] = []
    pos = 0
    while pos < len(path):
        if names:
            if not path.startswith(", ", pos):
                return None
            pos += 2
        m = _PATH_ELEMENT.match(path, pos)
        if m is None:
            return None
        token = m.group()
        names.append(token[1:-1].replace('""', '"') if token.startswith('"') else token)
        pos = m.end()
    return names


SERVER_INSTANCE = (
    "extract(epoch FROM pg_catalog.pg_postmaster_start_time())::pg_catalog.text"
    " OPERATOR(pg_catalog.||) '/' OPERATOR(pg_catalog.||) (SELECT d.oid FROM"
    " pg_catalog.pg_database AS d WHERE d.datname OPERATOR(pg_catalog.=)"
    " pg_catalog.current_database())::pg_catalog.text")
"""SQL for the server's start time as its epoch (which reads the same in every session: its
timestamptz text follows the session's TimeZone and DateStyle) and the connected database's
oid, qualified for any search_path: a change means PostgreSQL restarted, or the database
behind the name is another one (``SketchManager.server_started``). Why the oid: a database
dropped and created anew under its name from a template copy of itself, or two databases
swapping names, were answered from the old database's sketches held in memory (found by a
helper's search: a top-k row deleted after the copy still answered) — the copy has the same
table oids and epochs, so nothing else told them apart."""

@dataclass(frozen=True, slots=True)
class Relations:
    """What the query's tables are in this snapshot and search_path.

    ``reason``: why the query must pass through (its rows depend on the role, or a table is
    temporary), else None; ``oids``: each table's relation, in the analysis' order. A sketch
    is only ever used for a query whose tables are the very relations it was captured on: the
    same text names other tables under another search_path (another ``$user``, a schema
    added in front, a temporary table)."""

    reason: str | None
    oids: tuple[int, ...]
    names: tuple[tuple[str, str], ...]
    settings_free: bool = False
    """The query means the same whatever the session's TimeZone, DateStyle and IntervalStyle
    (:data:`_SETTINGS_FREE`)."""
    columns: tuple[str, ...] = ()
    """Of each table, a digest of its columns' names, types, typmods and collations
    (:data:`_COLUMNS`): an analysis of the query read the catalog as it was then."""


def relations(conn: psycopg.Connection[Any], analysis: QueryAnalysis) -> Relations:
    """The query's tables as this connection resolves them, in one round trip.

    Capture runs on the proxy's service connection, as the service role; the client's query
    runs as the client's role. When the two can see different rows — row-level security on a
    table, a view or foreign table (its definition may filter by role), a role-dependent
    function — a sketch captured for one role can miss rows the other needs: such queries pass
    through. (Found by tests/reliability: an RLS-restricted role got 0 groups instead of 1000.)
    So does a temporary table: it is the client session's own, and another session reading it
    sees none of its rows.
    """
    m = _ROLE_FUNCTIONS.search(analysis.sql)
    if m:
        return Relations(f"the query uses {m.group(1)}: its result depends on the role", (), ())
    tables = list(analysis.tables)
    if not tables:
        return Relations(None, (), ())
    read = analysis.columns_read()
    columns = (tuple((t.index + 1, None) for t in tables) if read is None
               else tuple((c.table + 1, c.column) for c in read))
    query = _relations_query(tuple((t.schema, t.name) for t in tables),
                             tuple(sorted(analysis.routines | GENERATED_ROUTINES)),
                             tuple(sorted(analysis.operators | GENERATED_OPERATORS)),
                             tuple(sorted(analysis.types)), columns,
                             tuple(sorted(analysis.collations)))
    oids, names, digests = [0] * len(tables), [("", "")] * len(tables), [""] * len(tables)
    rows = pipelined.fetch(conn, query)
    for i, relkind, rls, oid, schema, name, persistence, unseen, digest, shadowing, _free \
            in rows:
        if shadowing is not None:
            return Relations(str(shadowing), (), ())
        t = tables[int(i) - 1]
        if relkind in ("v", "f"):
            return Relations(f"{t.name} is a view or foreign table: its rows may depend on "
                             "the role", (), ())
        if rls:
            return Relations(f"{t.name} has row-level security: its rows depend on the role",
                             (), ())
        if persistence == "t":
            return Relations(f"{t.name} is a temporary table: only the client's session "
                             "can read its rows", (), ())
        if unseen:
            return Relations(f"{t.name} has a foreign or temporary table among its children "
                             "or partitions: their rows change unseen, or only the client's "
                             "session reads them", (), ())
        if int(oid) < FIRST_USER_OID:
            return Relations(f"{t.name} is a system catalog: it takes no audit trigger, so "
                             "every query would capture anew (slower than sending it)", (), ())
        oids[int(i) - 1], names[int(i) - 1] = int(oid), (str(schema), str(name))
        digests[int(i) - 1] = str(digest)
    if 0 in oids:
        missing = tables[oids.index(0)].name
        return Relations(f"{missing} is no table in the query's snapshot (created since, or "
                         "never)", (), ())
    return Relations(None, tuple(oids), tuple(names), bool(rows) and rows[0][-1] is True,
                     tuple(digests))


FIRST_USER_OID = 16384
"""PostgreSQL's first object id for user-created objects; relations below it are the
system's own catalogs."""

GENERATED_ROUTINES = frozenset({
    "count", "sum", "min", "max", "avg", "array_agg", "bool_or", "string_agg", "width_bucket",
    "unnest", "row_number", "generate_series", "percentile_disc", "format", "quote_ident",
    "to_regclass", "set_config", "current_setting", "current_schemas", "array_to_string",
    "pg_current_snapshot", "pg_snapshot_xmin", "pg_visible_in_snapshot",
    "pg_current_xact_id_if_assigned",
})
"""Functions the library's own SQL calls unqualified (captures, delta reads, instrumented
queries), in the client's search_path."""
GENERATED_OPERATORS = frozenset({"=", "<>", "<", "<=", ">", ">=", "+", "-", "*"})
"""Operators the library's own SQL uses."""

_REGCLASS = ("pg_catalog.to_regclass(CASE WHEN u.s IS NULL THEN pg_catalog.quote_ident(u.n)"
             " ELSE pg_catalog.quote_ident(u.s) || '.' || pg_catalog.quote_ident(u.n) END)")
"""The relation a row ``u(s, n)`` of schema and name resolves to on the search_path."""

_QUERY_TYPES = (
    "(SELECT pg_catalog.array_agg(v.x) FROM ("
    "  SELECT a.atttypid AS t FROM ROWS FROM (pg_catalog.unnest({schemas}::text[]),"
    "   pg_catalog.unnest({names}::text[])) AS u(s, n)"
    "  JOIN pg_catalog.pg_attribute AS a ON a.attrelid = " + _REGCLASS + " AND a.attnum > 0"
    "  UNION ALL SELECT pg_catalog.to_regtype(c) FROM pg_catalog.unnest({types}::text[]) AS c"
    " ) AS q JOIN pg_catalog.pg_type AS y ON y.oid = q.t"
    " CROSS JOIN LATERAL (VALUES (y.oid), (y.typbasetype), (y.typelem)) AS v(x)"
    " WHERE v.x >= 16384)")
"""The user-created types (an extension's among them) of the query's values: its tables'
columns and its casts, with a domain's base type and an array's element type."""

_USER_WRITTEN = ("(CASE WHEN {f}.prokind = 'a' THEN EXISTS (SELECT"
                 "  FROM pg_catalog.pg_aggregate AS g JOIN pg_catalog.pg_proc AS h ON h.oid IN"
                 "  (g.aggtransfn::oid, g.aggfinalfn::oid, g.aggcombinefn::oid, g.aggserialfn::oid,"
                 "   g.aggdeserialfn::oid, g.aggmtransfn::oid, g.aggminvtransfn::oid,"
                 "   g.aggmfinalfn::oid)"
                 "  WHERE g.aggfnoid = {f}.oid AND h.prolang NOT IN (12, 13))"
                 " ELSE {f}.prolang NOT IN (12, 13) END)")
"""SQL: the function ``{f}`` (a pg_proc row) runs code in a language any role may write
(SQL, PL/pgSQL …; an aggregate: one of its support functions does), not in C or internal
(12, 13) — which only a superuser (or an extension's script) can create."""

_ELEMENT = ("  JOIN pg_catalog.pg_type AS x ON x.oid = CASE WHEN y.typcategory = 'A'"
            "   AND y.typelem <> 0 THEN y.typelem ELSE y.oid END")
"""SQL: ``x``, the pg_type row of type ``y``'s array element (of ``y`` itself if no array)."""

_REACHED = ("EXISTS (SELECT FROM pg_catalog.unnest({args}) AS a(t)"
            "  JOIN pg_catalog.pg_type AS y ON y.oid = a.t" + _ELEMENT +
            "  WHERE (y.oid >= 16384 OR x.oid >= 16384) AND ({written} OR y.typtype <> 'b'"
            "   OR x.typtype <> 'b' OR EXISTS (SELECT FROM pg_catalog.pg_cast AS k"
            "    WHERE k.casttarget IN (y.oid, x.oid) AND k.castcontext = 'i')))")
"""SQL: one of the argument types ``{args}`` (an oid[]) is a user-created type (an array's
element counts) that a value of another type can become without the query naming it, where
``{written}`` (the function is :data:`_USER_WRITTEN`) or the type runs code on the way: a
domain (its CHECK constraints), an enum, composite or range (literals, rows and domains
inside), a type an implicit cast leads to (the cast's function)."""

_SHADOWING = psql.SQL(
    "(SELECT CASE WHEN NOT coalesce((SELECT p.s FROM"
    "  pg_catalog.unnest(pg_catalog.current_schemas(true)) WITH ORDINALITY AS p(s, i)"
    "  WHERE NOT p.s OPERATOR(pg_catalog.~~) 'pg\\_temp\\_%' ORDER BY p.i LIMIT 1)"
    "  OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.name, false)"
    " THEN 'a schema precedes pg_catalog on the search_path: a function or operator the query"
    " (or the proxy''s own SQL) uses may not be PostgreSQL''s built-in one'"
    " ELSE coalesce((SELECT pg_catalog.format('%s %I.%s: ', u.kind, u.nsp, u.name)"
    "  || CASE WHEN u.code"
    "  THEN 'the query may run code that is not PostgreSQL''s own' ELSE 'a function or operator"
    " the query (or the proxy''s own SQL) uses may not be PostgreSQL''s built-in one' END FROM ("
    "  SELECT 'function' AS kind, n.nspname AS nsp, f.proname::text AS name,"
    "  NOT (16384 > ALL (f.proargtypes::oid[])"
    "   OR f.proargtypes::oid[] OPERATOR(pg_catalog.&&) " + _QUERY_TYPES + ") AS code"
    "  FROM pg_catalog.pg_proc AS f JOIN pg_catalog.pg_namespace AS n ON n.oid = f.pronamespace"
    "  WHERE f.oid >= 16384 AND f.proname = ANY({routines}::text[])"
    "  AND (16384 > ALL (f.proargtypes::oid[])"
    "   OR f.proargtypes::oid[] OPERATOR(pg_catalog.&&) " + _QUERY_TYPES +
    "   OR n.nspname OPERATOR(pg_catalog.~~) 'pg\\_temp\\_%' OR "
    + _REACHED.format(args="f.proargtypes::oid[]", written=_USER_WRITTEN.format(f="f")) + ")"
    "  UNION ALL SELECT 'operator', n.nspname, o.oprname::text,"
    "  NOT (o.oprleft < 16384 AND o.oprright < 16384"
    "   OR ARRAY[o.oprleft, o.oprright] OPERATOR(pg_catalog.&&) " + _QUERY_TYPES + ")"
    "  FROM pg_catalog.pg_operator AS o"
    "  JOIN pg_catalog.pg_namespace AS n ON n.oid = o.oprnamespace"
    "  JOIN pg_catalog.pg_proc AS c ON c.oid = o.oprcode"
    "  WHERE o.oid >= 16384 AND o.oprname = ANY({operators}::text[])"
    "  AND (o.oprleft < 16384 AND o.oprright < 16384"
    "   OR ARRAY[o.oprleft, o.oprright] OPERATOR(pg_catalog.&&) " + _QUERY_TYPES +
    "   OR n.nspname OPERATOR(pg_catalog.~~) 'pg\\_temp\\_%' OR "
    + _REACHED.format(args="ARRAY[o.oprleft, o.oprright]", written=_USER_WRITTEN.format(f="c"))
    + ")"
    " ) AS u WHERE u.nsp <> 'pg_catalog'"
    "  AND u.nsp OPERATOR(pg_catalog.=) ANY(pg_catalog.current_schemas(true)) LIMIT 1),"
    " (SELECT pg_catalog.format('collation %s: not one of PostgreSQL''s own, a session may"
    "   resolve its name to another (its search_path), or it may be made anew', c.n)"
    "  FROM pg_catalog.unnest({collations}::text[]) AS c(n)"
    "  WHERE coalesce(pg_catalog.to_regcollation(c.n)::oid, 16384) >= 16384 LIMIT 1),"
    " (SELECT pg_catalog.format('cast to %s: the query may run code that is not"
    "   PostgreSQL''s own',"
    "   y.oid::regtype)"
    "  FROM pg_catalog.unnest({types}::text[]) AS c(n)"
    "  JOIN pg_catalog.pg_type AS y ON y.oid = pg_catalog.to_regtype(c.n)"
    + _ELEMENT +
    "  WHERE (y.oid >= 16384 OR x.oid >= 16384) AND (y.typtype <> 'b' OR x.typtype <> 'b')"
    "  LIMIT 1),"
    " (SELECT pg_catalog.format('cast function %s.%I: the query may run code that is not"
    "   PostgreSQL''s own', h.pronamespace::regnamespace, h.proname)"
    "  FROM pg_catalog.pg_cast AS k JOIN pg_catalog.pg_proc AS h ON h.oid = k.castfunc"
    "  WHERE k.castfunc >= 16384 AND "
    + _USER_WRITTEN.format(f="h")
    + " AND ARRAY[k.castsource, k.casttarget] OPERATOR(pg_catalog.&&) " + _QUERY_TYPES
    + " LIMIT 1)) END)")
"""A reason when the query (or the library's own SQL) may run a function or operator that is
not PostgreSQL's built-in one on the session's search_path, else NULL:

* a schema other than the session's temporary one precedes pg_catalog (any same-signature
  function, aggregate, operator or type there wins);
* a schema on the path defines a function (or aggregate) or an operator of a name of
  ``routines`` or ``operators`` that takes built-in types only (it wins where its argument
  types match better than pg_catalog's) or one of the query's own user-created types
  (:data:`_QUERY_TYPES`: citext's ``=`` and ``max``); or that a value can reach without the
  query naming its type (:data:`_REACHED`): an argument of a domain (``lower(v)`` on an int
  finds ``lower(dd)``, dd a domain over int, and runs dd's CHECK), enum, composite or range
  type, or of a type an implicit cast leads to, or — when the function is written in SQL,
  PL/pgSQL or another language any role may use (:data:`_USER_WRITTEN`) — of any user-created
  type (an untyped literal becomes one); or that lives in a temporary schema ``pg_temp_N``
  (PostgreSQL never looks there for the client's functions and operators, but the service
  connection lists the client's temporary schema by name, and finds them);
* a cast of the query targets a user-created type other than a base type (an array's
  element counts): a domain's CHECK constraints, a composite's or range's domain fields;
* a user-created cast function in such a language converts from or to one of the query's
  user-created types (PostgreSQL applies an implicit one unasked: ``sum(e)`` on an enum with
  ``CREATE CAST (mood AS int) WITH FUNCTION … AS IMPLICIT``).
* a ``COLLATE`` clause names a collation that is not PostgreSQL's own (made by initdb):
  its name may find another collation under another search_path, or one made anew after
  the capture, while the sketch is keyed on the tables only (found: a sketch captured under
  a sv-SE ``coll`` served a session whose ``coll`` was de-DE, 4 groups instead of 5).

16384: PostgreSQL's first user object id — only objects above it are read, down the oid
index: a database has few.

Why: the incremental engine and the answers from memory compute the built-in ones, and one
sketch serves every session whose names resolve to the same tables. An extension's operator
is found only where its schema is on the path: ``name = 'foo'`` on a citext column compares
case-insensitively there and as text elsewhere (found: a sketch captured with the
extension's schema on the path answered a session without it with 0 groups instead of 50).
Such a query passes through where the extension's operator is visible; sessions that resolve
to the built-in ones share sketches. Functions and operators on an extension's types a query
does not use block nothing (citext's ``max`` does not concern a query of integers: citext is
a base type no implicit cast leads to, its functions are C).

And the capture runs on the service connection, as a privileged role, the query's SQL on the
client's search_path: code of the client's own would run with the service role's privileges
(found: a domain's CHECK, ``lower(dd)`` and ``===(dd, int)`` — in the client's schema or its
temporary one — made an unprivileged role SUPERUSER through a query that PostgreSQL ran,
directly, as the role itself). Such queries pass through, and run as the client. What a
plain SELECT cannot reach: base types, operator classes, text search parsers and index
access methods are a superuser's (C code); ANALYZE evaluates index and statistics
expressions as the table's owner; views, foreign tables and row-level security pass
through (:func:`relations`)."""

_SETTINGS_FREE = (
    "(SELECT NOT EXISTS (SELECT FROM ("
    "  SELECT a.atttypid AS t"
    "  FROM ROWS FROM (pg_catalog.unnest({schemas}::text[]),"
    "   pg_catalog.unnest({names}::text[])) WITH ORDINALITY AS u(s, n, i)"
    "  JOIN pg_catalog.pg_attribute AS a ON a.attrelid = " + _REGCLASS +
    "  JOIN ROWS FROM (pg_catalog.unnest({read_tables}::int[]),"
    "   pg_catalog.unnest({read_columns}::text[])) AS k(i, c)"
    "   ON k.i = u.i AND (k.c IS NULL OR k.c = a.attname)"
    "  WHERE NOT a.attisdropped"
    "  UNION ALL SELECT pg_catalog.to_regtype(c) FROM pg_catalog.unnest({types}::text[]) AS c"
    " ) AS q"
    " LEFT JOIN pg_catalog.pg_type AS y ON y.oid = q.t"
    " LEFT JOIN pg_catalog.pg_type AS b ON b.oid = coalesce(nullif(y.typbasetype, 0), y.oid)"
    " LEFT JOIN pg_catalog.pg_type AS x"
    "  ON x.oid = CASE WHEN b.typcategory = 'A' THEN b.typelem ELSE b.oid END"
    " WHERE x.oid IS NULL OR x.typtype NOT IN ('b', 'e') OR (x.typtype = 'b' AND x.oid >= 16384)"
    "  OR x.typcategory IN ('D', 'T', 'R', 'C')))")
"""True when no value the query reads is of a type whose text TimeZone, DateStyle or
IntervalStyle change: the types of the columns it reads and of its casts (through a domain
and an array) are built-in scalars or enums other than dates, times, intervals, ranges and
composites. Such a query means the same in every session, whatever those settings."""

_UNSEEN_DESCENDANT = (
    "CASE WHEN c.relhassubclass THEN EXISTS (WITH RECURSIVE d(oid) AS (SELECT h.inhrelid"
    " FROM pg_catalog.pg_inherits AS h WHERE h.inhparent = c.oid UNION SELECT h.inhrelid"
    " FROM pg_catalog.pg_inherits AS h JOIN d ON h.inhparent = d.oid) SELECT 1 FROM d"
    " JOIN pg_catalog.pg_class AS k ON k.oid = d.oid"
    " WHERE k.relkind = 'f' OR k.relpersistence = 't') ELSE false END")
"""Whether a table has a foreign or temporary table among its inheritance children or
partitions (at any depth). A scan of the table reads them too: a foreign one changes with
no transaction of this server (no audit row, no commit the freshness check sees), and a
temporary one is read only by its own session, never by the service connection's capture
(found: a file_fdw partition's file rewritten, and a client's temporary child, each left
groups out of a sketch that was used). Searched only under a table that has or had
children (``relhassubclass``, which stays true after they go: a search then finds none)."""

_COLUMNS = (
    "(SELECT pg_catalog.md5(pg_catalog.string_agg(pg_catalog.quote_ident(a.attname)"
    " || ' ' || a.atttypid || ' ' || a.atttypmod"
    " || ' ' || a.attcollation, ',' ORDER BY a.attnum)) FROM pg_catalog.pg_attribute AS a"
    " WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped)")
"""A digest of a table's columns (``c``): what an analysis reads of them (the tables
unqualified names resolve to, the types rule 5 of :mod:`sketches.safety` decides by).
Found: after ``ALTER TABLE … ALTER COLUMN v TYPE float8`` a cached analysis still took
``sum(v)`` for an integer sum, which cannot raise; a float sum overflowing in a group the
sketch skipped gave rows where PostgreSQL raises 22003."""

_RELATIONS = psql.SQL(
    "SELECT u.i, c.relkind, c.relrowsecurity, c.oid::bigint, n.nspname, c.relname,"
    " c.relpersistence, " + _UNSEEN_DESCENDANT + ", " + _COLUMNS + ", {shadowing}, "
    + _SETTINGS_FREE +
    " FROM ROWS FROM (pg_catalog.unnest({schemas}::text[]),"
    "  pg_catalog.unnest({names}::text[])) WITH ORDINALITY AS u(s, n, i)"
    " JOIN pg_catalog.pg_class AS c ON c.oid = " + _REGCLASS +
    " JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace"
    " ORDER BY u.i")


@lru_cache(maxsize=256)
def _relations_query(tables: tuple[tuple[str | None, str], ...], routines: tuple[str, ...],
                     operators: tuple[str, ...], types: tuple[str, ...],
                     columns: tuple[tuple[int, str | None], ...],
                     collations: tuple[str, ...] = ()) -> str:
    """Kind, row-level security, oid, resolved name, persistence, unseen descendants
    (:data:`_UNSEEN_DESCENDANT`) and columns (:data:`_COLUMNS`) of each table (schema, name;
    in one round trip, in order),
    with the two checks of the whole query: shadowing
    (:data:`_SHADOWING`) and :data:`_SETTINGS_FREE` over ``columns`` ((table position from 1,
    column name or None for all its columns) read) and the casts' ``types``.

    Why literals, not parameters: the check runs again after every commit (its cache is per
    snapshot), and a prepared statement without parameters keeps one generic plan, where
    array parameters are planned anew on every call (most of the check's server time). Text,
    not bytes: psycopg encodes it in the connection's encoding (names may be non-ASCII)."""
    schemas = psql.Literal([s for s, _n in tables])
    names = psql.Literal([n for _s, n in tables])
    shadowing = _SHADOWING.format(routines=psql.Literal(list(routines)),
                                  operators=psql.Literal(list(operators)),
                                  types=psql.Literal(list(types)), schemas=schemas, names=names,
                                  collations=psql.Literal(list(collations)))
    return _RELATIONS.format(schemas=schemas, names=names, shadowing=shadowing,
                             types=psql.Literal(list(types)),
                             read_tables=psql.Literal([i for i, _c in columns]),
                             read_columns=psql.Literal([c for _i, c in columns])
                             ).as_string(None)


def by_preference(conn: psycopg.Connection[Any], schema: str, table: str,
                  attrs: Sequence[SafeAttribute]) -> list[SafeAttribute]:
    """The safe attributes, those that lead an index first (the skipping predicate can use
    it), each group in the given order."""
    rows = conn.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a"
        " ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
        " WHERE i.indrelid = (quote_ident(%s) || '.' || quote_ident(%s))::regclass",
        (schema, table)).fetchall()
    indexed = {r[0] for r in rows}
    return sorted(attrs, key=lambda a: a.column.column not in indexed)
