"""Persistence of range partitions and sketches in schema ``imp`` (pg_extensions/001_catalog.sql).

All functions run on the caller's connection and transaction, so what they read and write is
in the caller's snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql

import pg_extensions
from sketches import freshness
from sketches.ranges import RangePartition
from sketches.sketch import Sketch

log = logging.getLogger(__name__)

CAPTURE_SETTINGS = ("TimeZone", "DateStyle", "IntervalStyle", "standard_conforming_strings",
                    "array_nulls", "transform_null_equals", "timezone_abbreviations",
                    "lc_monetary", "bytea_output")
"""Settings that change what a query's text means (``'2020-01-01'`` as a timestamptz, ``v =
NULL``, a money literal) or a value's text (``bt::text``), as the proxy compares sessions on
(``imp_proxy.router.SESSION_SETTINGS``): a stored sketch holds for a query run under the
settings it was captured under, which are recorded with it."""

_SETTINGS_NOW = sql.SQL("ARRAY[{}, (current_setting('extra_float_digits')::int > 0)::text]"
                        ).format(sql.SQL(", ").join(
                            sql.SQL("current_setting({})").format(sql.Literal(n))
                            for n in CAPTURE_SETTINGS))
"""The connection's :data:`CAPTURE_SETTINGS` and whether extra_float_digits is positive (every
positive value prints a float the same, shortest exact way) as a ``text[]``, evaluated in the
statement that saves or loads a sketch."""


def ensure_installed(conn: psycopg.Connection[Any], lock_wait: str | None = None) -> bool:
    """Installs the ``imp`` schema's migrations if the sketch catalog (or its identity) is
    missing; True when it did (inside the caller's transaction, whose rollback takes the schema
    away again). Call :func:`claim_identity` before reading anything else of the schema.
    ``lock_wait``: the install's ``lock_timeout``, the one in force put back after it."""
    if is_installed(conn):
        return False
    freshness.note_ddl(conn)
    if lock_wait is None:
        pg_extensions.install(conn)
        return True
    row = conn.execute("SELECT current_setting('lock_timeout'),"
                       " set_config('lock_timeout', %s, true)", (lock_wait,)).fetchone()
    assert row is not None
    pg_extensions.install(conn)
    conn.execute("SELECT set_config('lock_timeout', %s, true)", (row[0],))
    return True


def claim_identity(conn: psycopg.Connection[Any], installed: bool = True) -> bool:
    """``imp.claim_identity()`` (pg_extensions/004_identity.sql): True when schema ``imp`` held
    the state of another database (restored by pg_dump / pg_restore from another cluster or
    database) and it was just discarded, in the caller's transaction. Its xids, snapshots and
    table oids mean other transactions and tables here: a restored own xid later handed to a
    user transaction hid that transaction's writes from the freshness check (a wrong answer).

    ``installed``: the caller knows the schema is installed (:func:`ensure_installed`); else
    a schema without the function (none, or one older than the identity) is nothing to judge
    and False is returned. Reads only when the identity matches: no xid for the caller."""
    if not installed:
        row = conn.execute("SELECT to_regprocedure('imp.claim_identity()') IS NOT NULL"
                           ).fetchone()
        if not (row and row[0]):
            return False
    row = conn.execute("SELECT imp.claim_identity()").fetchone()
    if row and row[0]:
        freshness.note_ddl(conn)   # it dropped the foreign schema's triggers and tables
    return bool(row and row[0])


def record_own_xid(conn: psycopg.Connection[Any], xid: int) -> None:
    """Records ``xid`` (the current transaction's) as one of the manager's own, catalog-only
    transactions (pg_extensions/003_own_xacts.sql), so a restarted manager knows it too."""
    conn.execute("INSERT INTO imp.own_xacts (xid) VALUES (%s::text::xid8) ON CONFLICT DO NOTHING",
                 (str(xid),))


def forget_own_xid(conn: psycopg.Connection[Any], xid: int) -> None:
    """Undoes :func:`record_own_xid` (the transaction may have changed user data after all:
    :func:`freshness.user_triggers_ran`)."""
    conn.execute("DELETE FROM imp.own_xacts WHERE xid = %s::text::xid8", (str(xid),))


def record_if_writer(conn: psycopg.Connection[Any]) -> None:
    """:func:`record_own_xid` of the current transaction if it got an xid (it wrote
    something) and no user's event trigger may have changed user data in it; one without an
    xid commits nothing another snapshot could see."""
    xid = freshness.assigned_xid(conn)
    if xid is not None and not freshness.user_triggers_ran(conn):
        record_own_xid(conn, xid)


def own_xids(conn: psycopg.Connection[Any]) -> set[int]:
    """The recorded own transactions (a previous run's included), read once when a manager
    starts. Rows older than every valid sketch version can no longer matter and are pruned
    here — not on every write: concurrent REPEATABLE READ prepares deleting the same rows
    failed with serialisation errors (then fell back to passthrough). A prune makes this
    transaction a writer, so it records itself."""
    cur = conn.execute("DELETE FROM imp.own_xacts WHERE xid < (SELECT min(pg_snapshot_xmin("
                       "version)) FROM imp.sketches WHERE valid)")
    if cur.rowcount:
        conn.execute("INSERT INTO imp.own_xacts (xid) VALUES (pg_current_xact_id())"
                     " ON CONFLICT DO NOTHING")
    rows = conn.execute("SELECT xid::text::bigint FROM imp.own_xacts").fetchall()
    return {int(r[0]) for r in rows}


def _load_bounds(conn: psycopg.Connection[Any], type_name: str,
                 literal: str) -> tuple[Any, ...]:
    row = conn.execute(sql.SQL("SELECT %s::{}[]").format(sql.SQL(type_name)),
                       (literal,)).fetchone()
    assert row is not None
    return tuple(row[0])


def save_partition(conn: psycopg.Connection[Any], p: RangePartition) -> RangePartition:
    """Stores ``p`` as the next version of its column's partition; returns it with id/version."""
    row = conn.execute(
        "INSERT INTO imp.range_partitions (schema_name, table_name, column_name, type_name,"
        " bounds, bounds_literal, version)"
        " SELECT %s, %s, %s, %s, %s, %s, coalesce(max(version), 0) + 1"
        " FROM imp.range_partitions"
        " WHERE schema_name = %s AND table_name = %s AND column_name = %s"
        " RETURNING id, version",
        (p.schema, p.table, p.column, p.type_name, list(p.literals), p.array_literal,
         p.schema, p.table, p.column)).fetchone()
    assert row is not None
    return p.with_id(int(row[0]), int(row[1]))


def _partition_from_row(conn: psycopg.Connection[Any],
                        row: Sequence[Any]) -> RangePartition | None:
    """A partition saved by this or an earlier version: one that named a domain (before
    :data:`sketches.ranges.CAST_TYPE`) is read as of its base type, as built now; None when
    its type's name names no type any more (a domain renamed, moved or dropped since: found,
    every query of the column then failed on loading it, for good)."""
    pid, schema, table, column, type_name, literals, array_literal, version, base, gone = row
    if gone:
        return None
    if base is not None:
        type_name = base
    return RangePartition(schema, table, column, type_name,
                          _load_bounds(conn, type_name, array_literal), tuple(literals),
                          array_literal, int(pid), int(version))


_PARTITION_COLUMNS = ("SELECT id, schema_name, table_name, column_name, type_name, bounds,"
                      " bounds_literal, version, (SELECT pg_catalog.format_type(y.typbasetype,"
                      " y.typtypmod) FROM pg_catalog.pg_type AS y"
                      " WHERE y.oid = pg_catalog.to_regtype(type_name)"
                      " AND y.typtype = 'd'), pg_catalog.to_regtype(type_name) IS NULL"
                      " FROM imp.range_partitions")


def latest_partition(conn: psycopg.Connection[Any], schema: str, table: str,
                     column: str) -> RangePartition | None:
    """The newest valid partition of the column, if any."""
    row = conn.execute(
        _PARTITION_COLUMNS + " WHERE schema_name = %s AND table_name = %s AND column_name = %s"
        " AND valid ORDER BY version DESC LIMIT 1", (schema, table, column)).fetchone()
    return _partition_from_row(conn, row) if row else None


def load_partition(conn: psycopg.Connection[Any], partition_id: int) -> RangePartition | None:
    row = conn.execute(_PARTITION_COLUMNS + " WHERE id = %s", (partition_id,)).fetchone()
    return _partition_from_row(conn, row) if row else None


def save_sketch(conn: psycopg.Connection[Any], sketch: Sketch,
                relations: Sequence[int] | None = None) -> int:
    """Inserts ``sketch`` (its partitions must have ids) captured on ``relations`` (the oids
    of all the query's tables, ``lookup.Relations``) under conn's :data:`CAPTURE_SETTINGS`;
    returns the new sketch id."""
    params = None if sketch.params is None else [None if v is None else str(v)
                                                  for v in sketch.params]
    types = None if sketch.params is None else [type(v).__name__ for v in sketch.params]
    row = conn.execute(sql.SQL(
        "INSERT INTO imp.sketches (template, query_text, params, param_types, tables, aliases,"
        " attributes, partition_ids, version, strategy, relations, settings)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s::pg_snapshot, %s, %s, {}) RETURNING id"
        ).format(_SETTINGS_NOW),
        (sketch.template, sketch.query, params, types,
         [f"{p.schema}.{p.partition.table}" for p in sketch.parts],
         [p.table.alias for p in sketch.parts],
         [p.column for p in sketch.parts], [p.partition.id for p in sketch.parts],
         sketch.version, sketch.strategy,
         None if relations is None else list(relations))).fetchone()
    assert row is not None
    sketch_id = int(row[0])
    if sketch.parts:
        # one statement, not executemany: psycopg prepares an executemany's statement, and
        # holding one it answers the connection's next ROLLBACK with DEALLOCATE ALL
        # (sketches.pipelined.PREPARE_WHEN_ASKED)
        conn.execute(sql.SQL(
            "INSERT INTO imp.sketch_fragments (sketch_id, ordinal, partition_id, fragments)"
            " VALUES {}").format(sql.SQL(", ").join(
                [sql.SQL("(%s, %s, %s, %s)")] * len(sketch.parts))),
            [v for i, p in enumerate(sketch.parts)
             for v in (sketch_id, i, p.partition.id, sorted(p.fragments))])
    return sketch_id


@dataclass(frozen=True, slots=True)
class StoredSketch:
    """A catalog row: enough to rebuild a ``Sketch`` once the query is re-analysed (tables are
    identified by alias, which is the same for every query of a template)."""

    id: int
    template: str
    query: str
    params: tuple[str | None, ...] | None
    aliases: tuple[str, ...]
    columns: tuple[str, ...]
    partitions: tuple[RangePartition, ...]
    fragments: tuple[frozenset[int], ...]
    version: str
    strategy: str
    captures: int
    maintenances: int
    uses: int
    relations: tuple[int, ...] | None = None
    """The oids of the query's tables when captured (None: a row of an older version)."""
    param_types: tuple[str, ...] | None = None
    """The Python type name of each parameter (None: a row of an older version)."""

    def typed_params(self) -> tuple[object, ...] | None:
        """The parameters as the values they were bound as; None when a type is unknown (an
        older row, or a type other than int, Decimal, float, str, bool): found, a numeric
        ``5`` read back as the integer PostgreSQL infers served an int query (``v / 5``
        divides otherwise), and a float threshold read back as a numeric served a numeric
        one."""
        if self.params is None or self.param_types is None \
                or len(self.params) != len(self.param_types):
            return None
        out: list[object] = []
        for text, kind in zip(self.params, self.param_types, strict=True):
            if kind == "NoneType" or text is None:
                out.append(None)
            elif kind not in _RESTORE:
                return None
            else:
                out.append(_RESTORE[kind](text))
        return tuple(out)


_RESTORE: dict[str, Callable[[str], object]] = {
    "int": int, "Decimal": Decimal, "float": float, "str": str, "bool": lambda t: t == "True"}


def load_sketches(conn: psycopg.Connection[Any], template: str) -> list[StoredSketch]:
    """Valid sketches of ``template`` captured under conn's :data:`CAPTURE_SETTINGS`, newest
    first. Why the settings: another proxy on the database, or this one restarted with
    another TimeZone, captured its sketches for what the query's text meant to it (found by
    a helper's search in session 25: a top-k under Asia/Tokyo answered with the UTC
    sketch's empty set instead of 3 rows). Rows of older versions, without settings, are
    captured again."""
    rows = conn.execute(sql.SQL(
        "SELECT s.id, s.template, s.query_text, s.params, s.aliases, s.attributes,"
        " s.version::text, s.strategy, s.captures, s.maintenances, s.uses,"
        " array_agg(f.partition_id ORDER BY f.ordinal),"
        " array_agg(array_to_string(f.fragments, ',') ORDER BY f.ordinal), s.relations,"
        " s.param_types"
        " FROM imp.sketches s JOIN imp.sketch_fragments f ON f.sketch_id = s.id"
        " WHERE s.template = %s AND s.valid AND s.aliases IS NOT NULL AND s.settings = {}"
        " GROUP BY s.id ORDER BY s.id DESC LIMIT 50").format(_SETTINGS_NOW),
        (template,)).fetchall()
    out = []
    for r in rows:
        partitions = []
        for pid in r[11]:
            p = load_partition(conn, int(pid))
            if p is None:
                break
            partitions.append(p)
        else:
            frags = tuple(frozenset(int(x) for x in s.split(",") if x) for s in r[12])
            out.append(StoredSketch(
                int(r[0]), r[1], r[2], None if r[3] is None else tuple(r[3]), tuple(r[4]),
                tuple(r[5]), tuple(partitions), frags, r[6], r[7], r[8], r[9], r[10],
                None if r[13] is None else tuple(int(x) for x in r[13]),
                None if r[14] is None else tuple(r[14])))
    return out


def other_settings(conn: psycopg.Connection[Any], template: str) -> list[int]:
    """Ids of the valid sketches of ``template`` captured under other settings than conn's,
    which :func:`load_sketches` leaves out: the manager invalidates them once they have gone
    unloaded for its ``idle_evict_after`` (their persisted states hold back the audit-row
    garbage collection for as long as they are valid)."""
    rows = conn.execute(sql.SQL(
        "SELECT id FROM imp.sketches WHERE template = %s AND valid"
        " AND settings IS DISTINCT FROM {}").format(_SETTINGS_NOW), (template,)).fetchall()
    return [int(r[0]) for r in rows]


def update_counters(conn: psycopg.Connection[Any], sketch_id: int, uses: int,
                    maintenances: int) -> None:
    """Adds ``uses``/``maintenances`` to the sketch's counters and stamps ``last_used``."""
    conn.execute("UPDATE imp.sketches SET uses = uses + %s, maintenances = maintenances + %s,"
                 " last_used = now() WHERE id = %s", (uses, maintenances, sketch_id))


def invalidate(conn: psycopg.Connection[Any], sketch_id: int) -> None:
    invalidate_many(conn, [sketch_id])


def invalidate_many(conn: psycopg.Connection[Any], sketch_ids: Sequence[int]) -> set[int]:
    """Invalidates the sketches ``sketch_ids`` (evicted: the garbage collection deletes their
    rows and persisted states next); returns the ids whose rows this snapshot sees."""
    rows = conn.execute("UPDATE imp.sketches SET valid = false WHERE id = ANY(%s) RETURNING id",
                        (list(sketch_ids),)).fetchall()
    return {int(r[0]) for r in rows}


def is_installed(conn: psycopg.Connection[Any]) -> bool:
    """Is the sketch catalog there (its sketches and fragments, the own transactions, the
    identity that tells whether they are this database's), with the sketches' settings?
    (A catalog of an older version is brought up to date: :func:`ensure_installed`.)"""
    row = conn.execute("SELECT to_regclass('imp.sketch_fragments') IS NOT NULL"
                       " AND to_regclass('imp.own_xacts') IS NOT NULL"
                       " AND to_regclass('imp.identity') IS NOT NULL"
                       " AND EXISTS (SELECT FROM pg_catalog.pg_attribute"
                       " WHERE attrelid = to_regclass('imp.sketches') AND attname = 'settings'"
                       " AND NOT attisdropped)").fetchone()
    return bool(row and row[0])


def delete_sketch(conn: psycopg.Connection[Any], sketch_id: int) -> bool:
    cur = conn.execute("DELETE FROM imp.sketches WHERE id = %s", (sketch_id,))
    return cur.rowcount > 0


def delete_all(conn: psycopg.Connection[Any]) -> int:
    cur = conn.execute("DELETE FROM imp.sketches")
    return cur.rowcount
