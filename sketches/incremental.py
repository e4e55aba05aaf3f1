"""Incremental maintenance (IMP) of the manager's sketches: the glue between
:mod:`sketches.manager` and the engine in :mod:`sketches.ivm` (docs/MAINTENANCE.md).

* :func:`compile_checked` — the pipeline of a query, refusing what the engine would maintain
  inexactly (``sum``/``avg`` over ``real``/``double precision``: a running float sum drifts from
  the sum PostgreSQL computes, and a drifted sum next to a HAVING threshold could drop a group).
* :func:`tracked` — are all of a pipeline's tables tracked *in the current snapshot*? Only then
  may state be built in it: the tracking transaction committed before the snapshot was taken,
  so every write the snapshot does not see fired the audit triggers (CREATE TRIGGER waits for
  the table's running writers).
* :func:`track` — ``imp.track_table`` in its own short transaction on a side connection (never
  in the client's snapshot, which must not see it: see the manager's docstring).
* :func:`collect_garbage` — ``imp.gc_deltas`` with a bound every live state already covers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

import pg_extensions
from sketches import catalog, deltas, freshness
from sketches.deltas import Snapshot
from sketches.ivm import partials
from sketches.ivm.errors import NotMaintainable
from sketches.ivm.expr import INT_BOUNDS, Col, Const, comparisons, temporal_kind
from sketches.ivm.pipeline import Pipeline
from sketches.ivm.plan import PlanSpec, SketchTarget, TableSpec, compile
from sketches.ivm.sqltext import arithmetic, bind_params, param_literal
from sketches.sql import QueryAnalysis
from sketches.typeoids import (
    BOOL,
    BPCHAR,
    BYTEA,
    CHAR,
    DATE,
    FLOAT4,
    FLOAT8,
    FLOATS,
    INT2,
    INT4,
    INT8,
    NAME,
    NUMERIC,
    OID,
    TEXT,
    TIME,
    TIMESTAMP,
    TIMESTAMPTZ,
    TIMETZ,
    UUID,
    VARCHAR,
)

log = logging.getLogger(__name__)

Conn = psycopg.Connection[Any]

STRATEGIES = ("lazy", "eager", "recapture")
ENGINE_TYPES = frozenset({
    BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID, FLOAT4, FLOAT8, NUMERIC, BPCHAR, VARCHAR,
    DATE, TIME, TIMESTAMP, TIMESTAMPTZ, UUID,
})
"""Types whose Python values (as psycopg loads them) group, compare and add as PostgreSQL's
do — with the engine's own checks for text order, blank-padded text, NaN and infinity — and
enums (loaded as their labels: equal as PostgreSQL's, never ordered, since the engine refuses
to order text). Any other type the engine would hold keeps recapture. Found: interval,
which psycopg loads with a year of 365 days where PostgreSQL compares 12 months of 30 days —
'1 year' and '360 days' were one group in PostgreSQL and two in the engine, and a maintained
HAVING count(*) sketch missed the group. Others differ too: timetz (equal instants in other
zones are two values in PostgreSQL), inet and cidr (another order), jsonb and arrays (loaded
unhashable), ranges and composites."""
READ_AS = {FLOAT4: "({})::float8", BPCHAR: "({})::text"}
"""How values of these types are read into Python, so that they compare there as PostgreSQL
compares them. A real: widened to float8 exactly, as PostgreSQL widens it to compare it with a
float8 or numeric (psycopg reads the real's shortest text, and ``'0.1'`` is the double nearest
0.1, not the real's 0.100000001490116…: found, ``GROUP BY x HAVING x > 0.1`` over a real ``x``
lost the group of ``0.1``, 0 rows instead of 1). A character(n): without its trailing blanks,
which its equality ignores (the cast to text drops them; found: ``'k5 '`` and ``'k5'`` were two
groups in Python and one in PostgreSQL, and the maintained sketch of ``HAVING count(*) > 100``
missed the group: 0 rows instead of 1)."""
_TEMPORAL_TYPES = {DATE: "date", TIMESTAMP: "timestamp", TIMESTAMPTZ: "timestamptz",
                   TIME: "time", TIMETZ: "timetz"}
"""The :func:`~sketches.ivm.expr.temporal_kind` of the values of these types."""
_ARITH_TYPES = frozenset({*INT_BOUNDS, FLOAT8, NUMERIC})
_COLLATABLE = frozenset({TEXT, BPCHAR, VARCHAR})   # ("char", name: C)
_SETTINGS = ("search_path", "TimeZone", "DateStyle", "IntervalStyle", "extra_float_digits")
_XID32 = 1 << 32


def check_strategy(name: str) -> str:
    value = name.strip().lower()
    if value not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, not {name!r}")
    return value


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """Settings that change how a query's expressions evaluate, as the client had them; the
    background maintenance re-applies them in its own transaction."""

    values: tuple[tuple[str, str], ...]

    @classmethod
    def read(cls, conn: Conn) -> SessionSettings:
        row = conn.execute(sql.SQL("SELECT {}").format(sql.SQL(", ").join(
            sql.SQL("current_setting({})").format(sql.Literal(n)) for n in _SETTINGS))
        ).fetchone()
        assert row is not None
        return cls(tuple(zip(_SETTINGS, (str(v) for v in row), strict=True)))

    def apply(self, conn: Conn) -> None:
        """``SET LOCAL`` of every value (inside the caller's transaction)."""
        for name, value in self.values:
            conn.execute("SELECT set_config(%s, %s, true)", (name, value))


def compile_checked(conn: Conn, analysis: QueryAnalysis, targets: Sequence[SketchTarget],
                    params: Sequence[object] | None) -> Pipeline:
    """The pipeline maintaining ``analysis`` on ``targets``; raises :class:`NotMaintainable`
    for what the engine refuses, for float ``sum``/``avg`` arguments and for values of a type
    outside :data:`ENGINE_TYPES`."""
    pipeline = compile(analysis, targets, params)
    spec = pipeline.spec
    _refuse_untracked(conn, [t.source for t in spec.tables])
    arith = _arith_types(conn, spec, params)
    args = [(f.func, a) for f, a in zip(spec.aggs, spec.agg_sql, strict=True) if a is not None]
    exprs = [*(a for _f, a in args), *spec.group_sql, *(p for t in spec.tables for p in t.payload)]
    compared = _compared(spec)
    exprs += [e for e in compared if e not in exprs]
    oids = _types(conn, spec.tables, exprs)
    typed = dict(zip(exprs, oids, strict=True))
    _refuse_nondeterministic(conn, spec.tables, [e for e in compared if typed[e] in _COLLATABLE])
    if not partials.eligible(spec):
        _refuse_cast_join_keys(spec, typed)
    _refuse_mixed_temporal(spec, typed)
    if any(func in ("sum", "avg") and o in FLOATS
           for (func, _a), o in zip(args, oids, strict=False)):
        raise NotMaintainable("sum/avg over a floating-point argument: an incremental "
                              "float sum can drift from PostgreSQL's")
    unlisted = sorted({o for o in oids if o not in ENGINE_TYPES})
    if unlisted:
        row = conn.execute("SELECT array_agg(format_type(t.oid, NULL)) FROM unnest(%s::oid[])"
                           " AS u(o) JOIN pg_catalog.pg_type AS t ON t.oid = u.o"
                           " WHERE t.typtype <> 'e'", (unlisted,)).fetchone()
        if row is None or row[0] is not None:   # enums pass: see ENGINE_TYPES
            raise NotMaintainable(f"values of type {', '.join(row[0] if row else [])} are "
                                  "not held by the engine (see incremental.ENGINE_TYPES)")
    read_as = {e: READ_AS[o].format(e) for e, o in typed.items() if o in READ_AS}
    if arith or read_as:
        pipeline = compile(analysis, targets, params, arith_types=arith, read_as=read_as)
    return pipeline


def _compared(spec: PlanSpec) -> list[str]:
    """The expressions whose values the engine tells apart by Python's equality: group keys,
    join keys and, for DISTINCT, every column."""
    out = [*spec.group_sql, *(e for j in spec.joins for e in (*j.left_sql, *j.right_sql))]
    if spec.kind == "distinct":
        out += [p for t in spec.tables for p in t.payload]
    return list(dict.fromkeys(out))


def _refuse_nondeterministic(conn: Conn, tables: Sequence[TableSpec],
                             texts: Sequence[str]) -> None:
    """Raises :class:`NotMaintainable` when one of the text expressions ``texts`` has a
    nondeterministic collation: PostgreSQL groups and joins ``'a'`` with ``'A'`` under a
    case-insensitive one, Python's equality does not. (Found: a group of ``GROUP BY k, s``
    counted its ``'C'`` rows apart from its ``'c'`` rows and the sketch missed it.)"""
    if not texts:
        return
    joined = sql.SQL(" CROSS JOIN ").join(_aliased(tables))
    if len(tables) > 1:
        joined = sql.SQL("({})").format(joined)
    row = conn.execute(sql.SQL(
        "SELECT string_agg(DISTINCT c.collname, ', ') FROM (SELECT ARRAY[{}] AS names"
        " FROM (SELECT) AS imp_one LEFT JOIN {} ON false) AS x, unnest(x.names) AS n(name)"
        " JOIN pg_catalog.pg_collation AS c ON c.oid = n.name::regcollation"
        " WHERE NOT c.collisdeterministic").format(
            sql.SQL(", ").join(sql.SQL("pg_collation_for({})").format(sql.SQL(e))
                               for e in texts), joined)).fetchone()
    if row is not None and row[0] is not None:
        raise NotMaintainable(f"a group, join or DISTINCT key has the nondeterministic "
                              f"collation {row[0]}: PostgreSQL's equality is not Python's")


_EXACT_FAMILIES = (frozenset({*INT_BOUNDS, NUMERIC}), frozenset({TEXT, VARCHAR}))
"""Types that PostgreSQL compares across (casting one side) exactly as Python compares their
values: integers of every width and numeric; text and varchar."""


def _refuse_cast_join_keys(spec: PlanSpec, typed: Mapping[str, int]) -> None:
    """Raises :class:`NotMaintainable` when a join the engine evaluates in Python (the row
    path: top-k or DISTINCT over a join) compares keys of two types that PostgreSQL compares
    by casting one side — numeric to float8 (``Decimal('0.1') != 0.1`` in Python), float4 to
    float8, date to timestamp, timestamp to timestamptz (never equal in Python) — or keys of
    character(n), whose trailing blanks PostgreSQL ignores and Python does not. (Found: a row
    joined on ``numeric = float8`` never entered the maintained top-k: 2 rows instead of 3.)
    Grouped aggregates over joins read their delta joined by PostgreSQL (:mod:`.partials`)."""
    for join in spec.joins:
        for left, right in zip(join.left_sql, join.right_sql, strict=True):
            a, b = typed[left], typed[right]
            same = a == b or any(a in f and b in f for f in _EXACT_FAMILIES)
            if not same or a == BPCHAR:
                raise NotMaintainable(f"join key {left} = {right} compares types {a} and {b}"
                                      " by PostgreSQL's rules, not Python's")


def _refuse_mixed_temporal(spec: PlanSpec, typed: Mapping[str, int]) -> None:
    """Raises :class:`NotMaintainable` when HAVING or ORDER BY compares a group key with a
    date/time constant of another kind (a date key with a timestamp parameter, a time with a
    timetz): PostgreSQL casts one side, Python's equality is false
    (:func:`sketches.ivm.expr.check_kinds`, which refuses the same while evaluating, for the
    comparisons not known here)."""
    width = len(spec.group_sql)
    for cmp in (c for e in (spec.having, *spec.order_exprs) for c in comparisons(e)):
        for key, other in ((cmp.left, cmp.right), (cmp.right, cmp.left)):
            if type(key) is not Col or key.index >= width or type(other) is not Const:
                continue
            kind = temporal_kind(other.value)
            if kind is not None and kind != _TEMPORAL_TYPES.get(typed[spec.group_sql[key.index]]):
                raise NotMaintainable(f"group key {spec.group_sql[key.index]} compared with a "
                                      f"{kind}: PostgreSQL casts one side, Python does not")


def _arith_types(conn: Conn, spec: PlanSpec, params: Sequence[object] | None
                 ) -> dict[str, int]:
    """PostgreSQL's result types of the HAVING / ORDER BY arithmetic the engine evaluates (by
    text); raises :class:`NotMaintainable` for a type other than an integer, numeric or float8
    (a real's product is rounded to a real in PostgreSQL, a date plus an integer is a date)."""
    texts = list(dict.fromkeys(
        a.sql for e in (spec.having, *spec.order_exprs) for a in arithmetic(e) if a.sql))
    if not texts:
        return {}
    bound = [bind_params(t, params, param_literal) for t in texts]
    oids = _types(conn, spec.tables, bound, spec.group_sql)
    odd = [t for t, o in zip(texts, oids, strict=True) if o not in _ARITH_TYPES]
    if odd:
        raise NotMaintainable(f"arithmetic {odd[0]} is not evaluated in Python (its type)")
    return dict(zip(texts, oids, strict=True))


def _types(conn: Conn, tables: Sequence[TableSpec], exprs: Sequence[str],
           group_by: Sequence[str] = ()) -> list[int]:
    """The type oids of ``exprs`` (SQL over the tables' aliases, grouped by ``group_by``),
    planned, never run."""
    if not exprs:
        return []
    from_items = sql.SQL(", ").join(_aliased(tables))
    grouping = sql.SQL(" GROUP BY {}").format(sql.SQL(", ").join(
        sql.SQL(g) for g in group_by)) if group_by else sql.SQL("")
    query = sql.SQL("SELECT {} FROM {}{} LIMIT 0").format(
        sql.SQL(", ").join(sql.SQL(e) for e in exprs), from_items, grouping)
    with conn.cursor() as cur:
        cur.execute(query)
        return [d.type_code for d in cur.description or ()]


def _aliased(tables: Sequence[TableSpec]) -> list[sql.Composable]:
    """``relation AS alias`` of each table, as the pipeline's SQL names them."""
    return [sql.SQL("{} AS {}").format(sql.SQL(t.source), sql.Identifier(t.alias))
            for t in tables]


def _refuse_untracked(conn: Conn, relations: Sequence[str]) -> None:
    """Raises :class:`NotMaintainable` when a table has inheritance children or partitions:
    a query of the parent reads their rows, but writes made to them directly fire only their
    own triggers, never the parent's audit (wrong answers, found by testing); for a
    materialized view, which takes no triggers (REFRESH replaces its rows): without it, its
    tracking was queued again after every capture and failed in every background round; and
    for an unlogged table, which a crash of PostgreSQL empties without a trigger or an epoch
    change (found: the maintained state kept the lost rows, and after new inserts the sketch
    of ``HAVING count(*) < 50`` lacked the group: 0 rows instead of 1). Recapture stays exact
    for them: a changed table is captured anew, an unchanged one reads the same rows. Also
    for an inheritance child or a partition: the audit's statement triggers with transition
    tables fire for the table a write names, so a write through the parent left no audit rows
    (found: a table attached as a partition, 20 rows inserted through the parent, a group
    missing). Also for the target of a logical-replication subscription: its apply worker
    fires only row-level triggers, so replicated writes left no audit rows (found by a
    regression search: a replicated UPDATE, a group missing)."""
    row = conn.execute(
        "SELECT (SELECT string_agg(DISTINCT h.inhparent::regclass::text, ', ')"
        "  FROM pg_catalog.pg_inherits AS h WHERE h.inhparent = ANY(array_agg(c.oid))),"
        " string_agg(c.oid::regclass::text, ', ') FILTER (WHERE c.relkind = 'm'),"
        " string_agg(c.oid::regclass::text, ', ') FILTER (WHERE c.relpersistence = 'u'),"
        " (SELECT string_agg(DISTINCT h.inhrelid::regclass::text, ', ')"
        "  FROM pg_catalog.pg_inherits AS h WHERE h.inhrelid = ANY(array_agg(c.oid))),"
        " (SELECT string_agg(DISTINCT s.srrelid::regclass::text, ', ')"
        "  FROM pg_catalog.pg_subscription_rel AS s WHERE s.srrelid = ANY(array_agg(c.oid)))"
        " FROM unnest(%s::text[]) AS r(name)"
        " JOIN pg_catalog.pg_class AS c ON c.oid = to_regclass(r.name)",
        (list(relations),)).fetchone()
    if row is not None and row[0] is not None:
        raise NotMaintainable(f"{row[0]} has inheritance children or partitions: writes to "
                              "them bypass its audit triggers")
    if row is not None and row[1] is not None:
        raise NotMaintainable(f"{row[1]} is a materialized view: REFRESH fires no triggers")
    if row is not None and row[2] is not None:
        raise NotMaintainable(f"{row[2]} is unlogged: a crash empties it without a trace in "
                              "its audit")
    if row is not None and row[3] is not None:
        raise NotMaintainable(f"{row[3]} is an inheritance child or a partition: a write naming "
                              "its parent fires only the parent's statement triggers")
    if row is not None and row[4] is not None:
        raise NotMaintainable(f"{row[4]} is a logical-replication subscription's target: its "
                              "apply worker fires no statement triggers")


def installed(conn: Conn) -> bool:
    """Is schema imp installed as this code reads it? Also false for an install older than
    ``imp.collected`` (the garbage-collection watermark every delta read's probe reads) or
    than ``tracked_tables.natts`` (which tells its DDL guard of a column dropped and added
    back): the next tracking installs the missing migrations (:func:`track`)."""
    row = conn.execute("SELECT to_regclass('imp.tracked_tables') IS NOT NULL"
                       " AND to_regclass('imp.ivm_state') IS NOT NULL"
                       " AND to_regclass('imp.own_xacts') IS NOT NULL"
                       " AND to_regclass('imp.collected') IS NOT NULL"
                       " AND EXISTS (SELECT FROM pg_catalog.pg_attribute WHERE attrelid ="
                       " to_regclass('imp.tracked_tables') AND attname = 'natts'"
                       " AND NOT attisdropped)").fetchone()
    return bool(row and row[0])


def stored_version_statement(key: str) -> deltas.Statement:
    """The read of :func:`stored_version`, to run alongside others (:func:`deltas.read_batch`)."""
    return deltas.Statement("SELECT version::text FROM imp.ivm_state WHERE sketch_key = %s",
                            (key,))


def stored_version_of(rows: Sequence[tuple[Any, ...]]) -> str | None:
    """:func:`stored_version` from the rows of :func:`stored_version_statement`."""
    return str(rows[0][0]) if rows else None


def stored_version(conn: Conn, key: str) -> str | None:
    """The version of the persisted state ``key`` in this snapshot (None: no row)."""
    return stored_version_of(deltas.run(conn, stored_version_statement(key)))


def relations(pipeline: Pipeline) -> list[str]:
    return [t.source for t in pipeline.spec.tables]


def tracked(conn: Conn, pipeline: Pipeline) -> bool:
    """True when every table of ``pipeline`` is tracked in conn's current snapshot, with its
    audit table (one dropped with the guard off is tracked afresh: ``deltas.Probe``), and
    schema imp has its DDL guard (``pg_extensions.ddl_guarded``)."""
    if not installed(conn):
        return False
    rels = relations(pipeline)
    row = conn.execute(
        "SELECT count(DISTINCT t.relid), (" + pg_extensions.GUARDED + ")"
        " FROM unnest(%s::text[]) AS r(name)"
        " JOIN imp.tracked_tables t ON t.relid = to_regclass(r.name)::oid"
        " WHERE " + deltas.WITH_AUDIT_TABLE,
        (rels,)).fetchone()
    return row is not None and int(row[0]) == len(set(rels)) and bool(row[1])


def track(conn: Conn, rels: Iterable[str], settings: SessionSettings,
          lock_timeout: str = "2s") -> None:
    """Tracks ``rels`` in one short transaction on ``conn`` (autocommit, a side connection),
    installing schema imp first if needed. The transaction is recorded as the manager's own:
    it creates triggers and audit tables, never changes user data. ``lock_timeout`` bounds how
    long CREATE TRIGGER may queue behind the table's writers (and hold new writers back).

    A table tracked already (a query whose snapshot predates its tracking queues it again)
    writes nothing, and then the transaction commits no xid: a commit would start a new
    snapshot for every client — each sketch maintained once more, each answer kept in memory
    dropped — for no change at all.

    Raises :class:`deltas.Unguarded`, tracking nothing, when schema imp has no DDL guard:
    its audit triggers would slow every write for states that are never built."""
    if not installed(conn):
        pg_extensions.install(conn)
    if not pg_extensions.ddl_guarded(conn):
        raise deltas.Unguarded(f"{', '.join(rels)} not tracked: schema imp has no DDL guard"
                               " (its event triggers need a superuser)")
    with conn.transaction():
        settings.apply(conn)
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (lock_timeout,))
        freshness.note_ddl(conn)
        for rel in rels:
            conn.execute("SELECT imp.track_table(to_regclass(%s))", (rel,))
        catalog.record_if_writer(conn)
    log.info("tracking %s", ", ".join(rels))


def meet(snapshots: Sequence[Snapshot]) -> Snapshot:
    """The snapshot in which exactly the xids visible in *every* one of ``snapshots`` are
    visible (xmin and xmax the smallest, xip every listed xid below that xmax)."""
    xmin = min(s.xmin for s in snapshots)
    xmax = min(s.xmax for s in snapshots)
    xip = frozenset(x for s in snapshots for x in s.xip if xmin <= x < xmax)
    return Snapshot(xmin, xmax, xip)


def join(snapshots: Sequence[Snapshot]) -> Snapshot:
    """The snapshot in which exactly the xids visible in *some* one of ``snapshots`` are
    visible (xmin and xmax the largest, xip every listed xid below that xmax visible in none
    of them): the garbage-collection watermark grows by it (:func:`collect_garbage`).

    Exact: an xid below the largest xmax, of snapshot s, that no snapshot sees is not visible
    in s, so s lists it; one below the largest xmin is visible in that snapshot."""
    xmin = max(s.xmin for s in snapshots)
    xmax = max(s.xmax for s in snapshots)
    xip = frozenset(x for s in snapshots for x in s.xip
                    if xmin <= x < xmax and not any(o.visible(x) for o in snapshots))
    return Snapshot(xmin, xmax, xip)


def text(s: Snapshot) -> str:
    return f"{s.xmin}:{s.xmax}:{','.join(str(x) for x in sorted(s.xip))}"


def horizon(conn: Conn) -> int:
    """An xid below which every transaction is visible to every snapshot that is open now or
    taken later: the oldest running xid and every backend's snapshot xmin (``backend_xmin`` is a
    32-bit xid: widened against the current full xid). Run it *before* the GC transaction takes
    its snapshot, so a state built in a snapshot that GC cannot yet see is protected by it."""
    row = conn.execute(
        "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint,"
        " pg_snapshot_xmax(pg_current_snapshot())::text::bigint,"
        " (SELECT array_agg(x::text::bigint) FROM (SELECT backend_xmin AS x FROM"
        "  pg_stat_activity WHERE backend_xmin IS NOT NULL UNION ALL SELECT backend_xid FROM"
        "  pg_stat_activity WHERE backend_xid IS NOT NULL) AS a)").fetchone()
    assert row is not None
    low, ref = int(row[0]), int(row[1])
    for x32 in row[2] or ():
        low = min(low, widen(int(x32), ref))
    return max(low, 0)


def widen(x32: int, ref: int) -> int:
    """The full xid whose low 32 bits are ``x32``, nearest the full xid ``ref`` (within
    2^31: PostgreSQL keeps every xid in use that close to the next one).

    Why nearest, not at or below ``ref``: a backend's xid or snapshot xmin read from
    ``pg_stat_activity`` may be newer than the snapshot that gave ``ref`` (a transaction that
    began in between). Taken as 2^32 older, it made the horizon negative, PostgreSQL read the
    bound as a huge snapshot, and the collection deleted every audit row, also those a state
    had still to read (found: a sketch maintained after that missed a committed
    transaction's rows, a group missing)."""
    diff = (x32 - ref) % _XID32
    if diff >= _XID32 // 2:
        diff -= _XID32
    return ref + diff


def collect_garbage(conn: Conn, live: Mapping[int, Sequence[str]], low: int) -> int:
    """Deletes audit rows covered by every live state: per tracked table, the meet of the
    versions of the states in memory (``live``: relid → versions) and persisted in
    ``imp.ivm_state`` (read here, so states persisted by any manager count) and of ``low``
    (:func:`horizon`, protecting states being built in snapshots still open). ``conn`` must be
    in a REPEATABLE READ transaction that began after ``low`` was read. Returns the rows
    deleted.

    Where it deletes rows ``imp.gc_deltas`` moves the table's watermark (``imp.collected``)
    to the join of the old one and the bound, in the same transaction (also when an older
    proxy on the database collects): a state this collection could not
    see (held in memory by another manager whose persisted row was dropped) is refused by
    the watermark check of ``Pipeline.apply`` instead of stepping over the rows. Another
    collection committing meanwhile makes the watermark's write fail (40001): this round
    fails and the next one retries. No state the bound covered is refused: the bound is
    within every version it was met with, and within ``low:low:``, which every snapshot open
    when ``low`` was read or taken later contains; versions only grow from there."""
    # states whose sketch is gone (a capture rolled back after saving, a drop elsewhere)
    # would hold the bound back for ever
    conn.execute(
        "DELETE FROM imp.ivm_state s WHERE s.sketch_key ~ '^[0-9]+$' AND NOT EXISTS"
        " (SELECT 1 FROM imp.sketches k WHERE k.id = s.sketch_key::bigint AND k.valid)")
    # an invalidated sketch (each recapture leaves one) is never read again: its row, query
    # text and fragment rows went on piling up (found: one per recapture, for ever)
    conn.execute("DELETE FROM imp.sketches WHERE NOT valid")
    rows = conn.execute(
        "SELECT rel::bigint, s.version::text FROM imp.ivm_state s,"
        " LATERAL jsonb_object_keys(s.epochs) AS rel").fetchall()
    versions: dict[int, list[Snapshot]] = {}
    for rel, version in rows:
        versions.setdefault(int(rel), []).append(Snapshot.parse(str(version)))
    for rel, vs in live.items():
        versions.setdefault(rel, []).extend(Snapshot.parse(v) for v in vs)
    tables = conn.execute("SELECT relid::bigint FROM imp.tracked_tables").fetchall()
    # watermarks of tables no longer tracked (their states are invalid anyway)
    conn.execute("DELETE FROM imp.collected AS c WHERE NOT EXISTS"
                 " (SELECT 1 FROM imp.tracked_tables AS t WHERE t.relid = c.relid)")
    floor = Snapshot(low, low, frozenset())
    deleted = 0
    for (rel,) in tables:
        bound = meet([*versions.get(int(rel), []), floor])
        row = conn.execute("SELECT imp.gc_deltas(%s::oid::regclass, %s::pg_snapshot)",
                           (int(rel), text(bound))).fetchone()
        deleted += int(row[0]) if row and row[0] else 0
    catalog.record_if_writer(conn)   # a delete (orphans, audit rows) or an ANALYZE
    log.debug("gc: %d audit rows deleted", deleted)
    return deleted

