"""Range partitions of one column: the fragments that provenance sketches are made of.

A partition on column ``a`` of table ``T`` is a sorted tuple of distinct bounds
``b_1 < … < b_n``. Fragment ``0`` holds ``a < b_1``, fragment ``i`` (``1 <= i < n``) holds
``b_i <= a < b_{i+1}``, fragment ``n`` holds ``a >= b_n``, and fragment ``n + 1`` holds the
NULLs, so every row of ``T`` falls into exactly one fragment whatever its value.

The fragment id of a value is computed identically

* in SQL: ``coalesce(width_bucket(a, '{b_1,…,b_n}'::<type>[]), n + 1)`` — ``width_bucket``
  with a thresholds array returns the number of thresholds ``<= a``, i.e. 0 … n;
* in Python: ``bisect_right(bounds, a)`` (``n + 1`` for ``None``).

Both count the bounds that are ``<=`` the value, under the type's default ordering.

Collation caveat (text columns): ``width_bucket`` and the skipping predicate compare with the
column's collation, Python compares code points. The two agree for the ``C`` collation (UTF-8
byte order is code point order), which is what the project's clusters use (``initdb
--locale=C``). Under a linguistic collation the SQL side is still self-consistent (capture and
skipping predicate use the same comparison, so results stay exact), but ``fragment_of`` may
disagree with SQL near bounds. NaN and ±infinity are never bounds (PostgreSQL orders them
first or last, so the first or last fragment holds them), nor are values psycopg cannot load
(BC dates, years after 9999, the time 24:00:00; :data:`_LOADABLE`). Columns of types
psycopg does not load (enums, user-created and extension types) are not partitioned:
PartitionError; nor are built-in types outside :data:`ORDERED_TYPES` (jsonb, arrays,
tsvector, point, …): :class:`UnorderedType`.

Bounds come from ``pg_stats`` (the equi-depth histogram plus the most common values) after
``ANALYZE``; when more fragments are wanted than the histogram has, the column's statistics
target is raised first. The bounds are then thinned evenly to the configured count.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from sketches import freshness
from sketches.errors import PartitionError

log = logging.getLogger(__name__)

MAX_STATISTICS_TARGET = 10_000


@dataclass(frozen=True, slots=True)
class RangePartition:
    """A range partition of ``schema.table.column``.

    ``bounds`` are the typed Python values (as psycopg returns them), ``literals`` their
    PostgreSQL text output (which casts back to exactly the same value), ``array_literal`` the
    PostgreSQL array literal of all bounds, ``type_name`` the column's type as printed by
    ``format_type``, a domain's base type for a domain (:data:`CAST_TYPE`; the bounds array
    is cast to ``type_name[]``). ``id`` is the catalog id
    (``None`` until persisted); ``version`` increases whenever the partition of this column is
    rebuilt.
    """

    schema: str
    table: str
    column: str
    type_name: str
    bounds: tuple[Any, ...]
    literals: tuple[str, ...]
    array_literal: str
    id: int | None = None
    version: int = 1

    @property
    def n(self) -> int:
        """Number of bounds."""
        return len(self.bounds)

    @property
    def null_fragment(self) -> int:
        """Id of the fragment holding the NULLs (``n + 1``)."""
        return len(self.bounds) + 1

    @property
    def fragment_count(self) -> int:
        """Number of fragments, NULL fragment included (``n + 2``)."""
        return len(self.bounds) + 2

    def fragment_of(self, value: Any) -> int:
        """The fragment holding ``value``: ``bisect_right(bounds, value)``, NULL → ``n + 1``."""
        if value is None:
            return self.null_fragment
        return bisect.bisect_right(self.bounds, value)

    def fragment_sql(self, expr: sql.Composable) -> sql.Composable:
        """``coalesce(width_bucket(expr, bounds::type[]), n + 1)`` as a psycopg composable."""
        return sql.SQL("coalesce(width_bucket({}, {}::{}[]), {})").format(
            expr, sql.Literal(self.array_literal), sql.SQL(self.type_name),
            sql.Literal(self.null_fragment))

    def with_id(self, partition_id: int, version: int) -> RangePartition:
        """A copy carrying the catalog id and version."""
        return RangePartition(self.schema, self.table, self.column, self.type_name, self.bounds,
                              self.literals, self.array_literal, partition_id, version)

    def runs(self, fragments: Iterable[int]) -> list[tuple[int, int]]:
        """Maximal runs ``(first, last)`` of adjacent non-NULL fragment ids, ascending."""
        ids = sorted(f for f in set(fragments) if 0 <= f <= self.n)
        out: list[tuple[int, int]] = []
        for f in ids:
            if out and out[-1][1] == f - 1:
                out[-1] = (out[-1][0], f)
            else:
                out.append((f, f))
        return out

    def run_bounds(self, first: int, last: int) -> tuple[str | None, str | None]:
        """Literals ``(lo, hi)`` such that fragments ``first..last`` are ``lo <= a < hi``;
        ``None`` for an open end."""
        lo = self.literals[first - 1] if first > 0 else None
        hi = self.literals[last] if last < self.n else None
        return lo, hi

    def covers_all(self, fragments: Iterable[int], nullable: bool = True) -> bool:
        """True when ``fragments`` include every non-NULL fragment (and the NULL one if the
        column can hold NULLs): skipping would then read everything anyway."""
        have = set(fragments)
        if not all(f in have for f in range(self.n + 1)):
            return False
        return not nullable or self.null_fragment in have


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    """Catalog facts about one column."""

    schema: str
    table: str
    column: str
    type_name: str
    """What its bounds are cast to (:data:`CAST_TYPE`)."""
    not_null: bool
    stats_target: int
    value_type: str = ""
    """The type its values are loaded as: its own, or a domain's base type ("" when psycopg
    does not know it: an enum, a user-created or extension type, a domain over one).
    ``bpchar``, not ``character``, for blank-padded text: a cast to ``character[]`` is one to
    ``character(1)[]``, which cut every bound to its first character."""


CAST_TYPE = ("CASE WHEN y.typtype = 'd' THEN format_type(y.typbasetype, y.typtypmod)"
             " ELSE format_type(a.atttypid, a.atttypmod) END")
"""SQL (over ``pg_attribute a`` and the column's ``pg_type y``): the type a column's bounds
are cast to — its own, or a domain's base type with the domain's modifier. Why not the
domain: a cast to it runs the domain's CHECK constraints, which reading the column never
does, so the instrumented query could raise in the client's session what the client's
own query cannot (found: a CHECK reading a setting of the session, or calling a function
replaced since the service connection cached it, raised 23514 where PostgreSQL returned
the rows). The comparisons and ``width_bucket`` take the base type's operators either way."""


def column_info(conn: psycopg.Connection[Any], schema: str, table: str,
                column: str) -> ColumnInfo:
    """Type and statistics target of ``schema.table.column``; raises PartitionError if absent."""
    row = conn.execute(
        "SELECT " + CAST_TYPE + ", a.attnotnull, a.attstattarget,"
        " coalesce(co.collisdeterministic, true),"
        " CASE WHEN b.oid = 'bpchar'::regtype THEN 'bpchar'"
        " WHEN b.oid < 16384 THEN format_type(b.oid, NULL) ELSE '' END"
        " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " JOIN pg_type y ON y.oid = a.atttypid"
        " JOIN pg_type b ON b.oid = coalesce(nullif(y.typbasetype, 0), y.oid)"
        " LEFT JOIN pg_collation co ON co.oid = a.attcollation"
        " WHERE n.nspname = %s AND c.relname = %s AND a.attname = %s"
        " AND a.attnum > 0 AND NOT a.attisdropped",
        (schema, table, column)).fetchone()
    if row is None:
        raise PartitionError(f"no column {schema}.{table}.{column}")
    if not row[3]:
        # 'a' = 'A' under a nondeterministic collation, yet they may fall into different
        # fragments: a fragment would no longer hold all rows of a value (safety's premise).
        raise PartitionError(f"{schema}.{table}.{column} has a nondeterministic collation")
    return ColumnInfo(schema, table, column, str(row[0]), bool(row[1]), int(row[2]),
                      str(row[4]))


class UnorderedType(PartitionError):
    """The column's type is not one of :data:`ORDERED_TYPES`: its values, loaded by psycopg,
    neither sort in Python as PostgreSQL sorts them nor cast back to the values they were
    read from, so no bounds can be built (the column is no sketch attribute)."""


ORDERED_TYPES = frozenset({
    "smallint", "integer", "bigint", "oid", "numeric", "real", "double precision",
    "text", "character varying", "bpchar", "name", "bytea", "uuid", "boolean",
    "date", "time without time zone", "timestamp without time zone",
    "timestamp with time zone", "interval",
})
"""Value types (:attr:`ColumnInfo.value_type`) a partition is built on: psycopg loads their
values as Python values ordered as PostgreSQL orders them (text under the ``C`` collation,
see above) and dumps them back as values PostgreSQL orders the same (an interval of
``1 mon`` comes back as ``30 days``, its equal), so bounds sorted in Python and sent back
as a ``type[]`` are sorted for ``width_bucket``. Why an allow-list: anything else failed in the
middle of the capture, aborting the client's transaction — jsonb bounds came back as Python
ints and were sent as a ``smallint[]`` (no cast to ``jsonb[]``), an ``int[]`` column's
histogram was read as ``integer[][]`` elements — or would sort wrongly (money, tsvector,
bit and ``"char"`` load as text, inet and cidr as ipaddress objects that do not compare
across kinds). Not ``time with time zone``: PostgreSQL 15's ``width_bucket`` steps through a
``timetz[]`` by the type's 12-byte length where its elements lie 16 bytes apart, and
returns wrong buckets (found: 6 groups instead of 40)."""


def check_partitionable(info: ColumnInfo) -> None:
    """Raises :class:`PartitionError` unless a partition can be built on the column: psycopg
    loads its values, and its type is one of :data:`ORDERED_TYPES`. Cheap (no query), so it
    runs before ``ANALYZE``, which every capture would otherwise run again, and before any
    statement that could fail and abort the caller's transaction."""
    where = f"{info.schema}.{info.table}.{info.column}"
    if not info.value_type:
        raise PartitionError(f"{where}: psycopg cannot load values of type {info.type_name}")
    if info.value_type not in ORDERED_TYPES:
        raise UnorderedType(f"{where}: values of type {info.type_name} do not sort in Python"
                            " as in PostgreSQL")


def thin(values: Sequence[Any], count: int) -> list[Any]:
    """At most ``count`` values picked evenly from the sorted, distinct ``values``."""
    if count <= 0:
        return []
    if len(values) <= count:
        return list(values)
    step = len(values) / count
    picked = [values[min(len(values) - 1, int(i * step))] for i in range(count)]
    out: list[Any] = []
    for v in picked:
        if not out or out[-1] != v:
            out.append(v)
    return out


_NOT_FINITE = "('infinity', '-infinity', 'Infinity', '-Infinity', 'NaN')"
"""The text of values Python cannot hold (dates and timestamps of ±infinity) or order
(numeric and float NaN). They are never bounds: PostgreSQL orders them first or last, so
the partition's first or last fragment holds them."""


_DATED = "x >= '0002-01-01' AND x < '9999-01-01'"
_LOADABLE = {
    "date": _DATED, "timestamp without time zone": _DATED, "timestamp with time zone": _DATED,
    "time without time zone": "left(x::text, 3) <> '24:'",
}
"""Conditions on the values psycopg loads, by type: dates and timestamps within years 1 to
9999 (a BC date or a later year raises; the margin of a year on each side keeps a
timestamptz in range in any time zone), and times before 24:00:00 (PostgreSQL's last
time, which Python's ``time`` cannot hold). Other values are never bounds either: they sort
first or last, like ±infinity."""


MAX_BOUND_BYTES = 1024
"""The widest text a bound may have (ANALYZE's own limit for statistics values). Any subset
of sorted values partitions a column as well, only more coarsely; every bound is written
twice into each instrumented query and kept in the catalog. Found: a column whose values
were all 100 kB wide (none in its statistics) took 300 of them as exact quantiles, a 30 MB
bounds list and 9 MB instrumented queries, 11 s for the first query and about 1 GB of
memory; answers were exact."""


def _finite(array: sql.Composable, value_type: str) -> sql.Composable:
    """SQL for the elements of ``array`` (a typed array of ``value_type``) Python can hold
    and order: not :data:`_NOT_FINITE`, within :data:`_LOADABLE`, and no wider than
    :data:`MAX_BOUND_BYTES`."""
    cond = sql.SQL("x::text NOT IN {} AND pg_catalog.octet_length(x::text) <= {}").format(
        sql.SQL(_NOT_FINITE), sql.Literal(MAX_BOUND_BYTES))
    if value_type in _LOADABLE:
        cond = sql.SQL("{} AND {}").format(cond, sql.SQL(_LOADABLE[value_type]))
    return sql.SQL("ARRAY(SELECT x FROM unnest({}) AS x WHERE {})").format(array, cond)


def _stats_values(conn: psycopg.Connection[Any], info: ColumnInfo) -> list[Any]:
    """Histogram bounds and most common values of the column, typed, NULL-free, and values
    Python can hold and order (:func:`_finite`)."""
    typed = sql.SQL(info.value_type)
    row = conn.execute(
        sql.SQL("SELECT {}, {} FROM pg_stats WHERE schemaname = %s AND tablename = %s"
                " AND attname = %s").format(
            _finite(sql.SQL("histogram_bounds::text::{}[]").format(typed), info.value_type),
            _finite(sql.SQL("most_common_vals::text::{}[]").format(typed), info.value_type)),
        (info.schema, info.table, info.column)).fetchone()
    if row is None:
        return []
    values = [v for part in row if part is not None for v in part if v is not None]
    return values


_LOCKED = ("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks AS l"
           " JOIN pg_catalog.pg_class AS c ON c.oid = l.relation"
           " JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace"
           " WHERE n.nspname = %s AND c.relname = %s AND l.pid <> pg_catalog.pg_backend_pid()"
           " AND l.mode IN ('ShareUpdateExclusiveLock', 'ShareLock', 'ShareRowExclusiveLock',"
           " 'ExclusiveLock', 'AccessExclusiveLock'))")
"""Does another session hold, or wait for, a lock that the capture's ``ALTER … SET
STATISTICS`` and ``ANALYZE`` (SHARE UPDATE EXCLUSIVE) would wait for? A VACUUM, an ANALYZE or a
CREATE INDEX CONCURRENTLY does, where the query itself needs only ACCESS SHARE: a query
PostgreSQL answers at once waited for the whole VACUUM (found: pgjdbc's 2 s query timeout ran
out). Then the existing statistics (or exact quantiles) serve."""

STATISTICS_LOCK_WAIT = "2s"
"""How long those two wait for a lock taken after the check above (at most: a shorter
``lock_timeout`` in force is kept); longer than ``deadlock_timeout``, after which an
autovacuum in the way cancels itself. Failing, the capture passes the query through."""


_BOUNDED_WAIT = ("SELECT current_setting('lock_timeout'), set_config('lock_timeout',"
                 " CASE WHEN current_setting('lock_timeout')::interval"
                 " BETWEEN '1 us' AND %s::interval THEN current_setting('lock_timeout')"
                 " ELSE %s END, true)")
"""Reads the ``lock_timeout`` in force (the client's, when the caller set it) and bounds it
by :data:`STATISTICS_LOCK_WAIT` for the statements that follow, transaction-locally."""


def _bound_lock_wait(conn: psycopg.Connection[Any]) -> str:
    """Bounds ``lock_timeout`` (:data:`_BOUNDED_WAIT`) and returns the one in force before,
    for the caller to put back after its statements."""
    row = conn.execute(_BOUNDED_WAIT, (STATISTICS_LOCK_WAIT, STATISTICS_LOCK_WAIT)).fetchone()
    assert row is not None
    return str(row[0])


def lock_query_tables(conn: psycopg.Connection[Any], tables: Iterable[tuple[str, str]]) -> None:
    """ACCESS SHARE on every one of ``tables`` (schema, name: a query's tables), waiting at
    most :data:`STATISTICS_LOCK_WAIT` (or the shorter ``lock_timeout`` in force, which is put
    back afterwards); raises ``LockNotAvailable`` when one cannot be had, and the capture
    fails (the query passes through).

    Why, before a capture raises a statistics target and ANALYZEs a table: those take SHARE
    UPDATE EXCLUSIVE, held to the capture's commit. A capture that then waited for another
    table of the query (a role keeping its own table locked ACCESS EXCLUSIVE in an open
    transaction) kept CREATE INDEX, VACUUM, ANALYZE and DDL on the first table waiting as
    long as that role liked, where the query itself, run directly, holds only ACCESS SHARE
    (found: CREATE INDEX blocked for as long as the lock was held). With every table's
    ACCESS SHARE in hand first, nothing after the ANALYZE waits for the query's tables."""
    names = sorted({(s, n) for s, n in tables if s and n})
    if not names:
        return
    before = _bound_lock_wait(conn)
    # a query's ACCESS SHARE, taken while it is planned (LOCK TABLE refuses a materialized
    # view: found, every query of one passed through)
    conn.execute(sql.SQL("SELECT FROM {} LIMIT 0; "
                         "SELECT set_config('lock_timeout', {}, true)").format(
        sql.SQL(", ").join(sql.Identifier(s, n) for s, n in names), sql.Literal(before)))


def _ensure_statistics(conn: psycopg.Connection[Any], info: ColumnInfo, wanted: int) -> None:
    """Raises the column's statistics target to ``wanted`` (if lower) and runs ANALYZE.

    Only when the current role owns the table (else the existing statistics are used). No
    savepoint is used on purpose: a subtransaction would get an xid of its own, which
    ``sketches.freshness`` could not attribute to the manager."""
    owner = conn.execute(
        "SELECT pg_has_role(c.relowner, 'USAGE') FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s", (info.schema, info.table)).fetchone()
    if owner is None or not owner[0]:
        log.info("not the owner of %s.%s: using its existing statistics", info.schema,
                 info.table)
        return
    target = min(MAX_STATISTICS_TARGET, max(wanted, 100))
    ident = sql.Identifier(info.schema, info.table)
    col = sql.Identifier(info.column)
    current = info.stats_target if info.stats_target >= 0 else 100
    busy = conn.execute(_LOCKED, (info.schema, info.table)).fetchone()
    if busy is not None and busy[0]:
        log.info("%s.%s is locked against ANALYZE: using its existing statistics", info.schema,
                 info.table)
        return
    before = _bound_lock_wait(conn)
    if current < target:
        log.info("raising statistics target of %s.%s.%s to %d",
                 info.schema, info.table, info.column, target)
        freshness.note_ddl(conn)
        conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET STATISTICS {}").format(
            ident, col, sql.Literal(target)))
    conn.execute(sql.SQL("ANALYZE {} ({})").format(ident, col))
    conn.execute("SELECT set_config('lock_timeout', %s, true)", (before,))


_TEXT_STYLE = ("SELECT set_config('DateStyle', 'ISO, YMD', true),"
               " set_config('IntervalStyle', 'postgres', true),"
               " set_config('extra_float_digits', '1', true)")
"""Settings under which the bounds' text is written: read back the same in every session (an
ISO date is no other date under any DateStyle). Found: a partition built under ``SQL, DMY``
kept ``01/06/2020``, 6 January to a session (or a restarted manager's connection) under
``SQL, MDY``; its sketch then skipped the rows of 1 June (0 rows instead of 3)."""


def _typed_bounds(conn: psycopg.Connection[Any], info: ColumnInfo,
                  values: list[Any]) -> tuple[tuple[Any, ...], tuple[str, ...], str]:
    """Round-trips the bounds through PostgreSQL: typed values, text literals, array literal
    (text in :data:`_TEXT_STYLE`, whose settings are undone after)."""
    with conn.transaction(force_rollback=True):
        conn.execute(_TEXT_STYLE)
        row = conn.execute(
            sql.SQL("SELECT b, array(SELECT x::text FROM unnest(b) AS x), b::text"
                    " FROM (SELECT %s::{}[] AS b) AS s").format(sql.SQL(info.value_type)),
            (values,)).fetchone()
    assert row is not None
    return tuple(row[0]), tuple(row[1]), str(row[2])


def build_partition(conn: psycopg.Connection[Any], schema: str, table: str, column: str,
                    fragments: int = 1000) -> RangePartition:
    """Builds a partition of at most ``fragments`` non-NULL fragments from ``pg_stats``.

    Runs ``ANALYZE`` on the column (after raising its statistics target when needed), so the
    caller must own the table. Falls back to exact quantiles (``percentile_disc``) when the
    statistics hold no values (e.g. a table too small for a histogram).
    """
    if fragments < 1:
        raise PartitionError("a partition needs at least one fragment")
    info = column_info(conn, schema, table, column)
    check_partitionable(info)
    wanted = fragments - 1  # n bounds make n + 1 non-NULL fragments
    _ensure_statistics(conn, info, wanted + 1)
    values = sorted(set(_stats_values(conn, info)))
    if not values and wanted > 0:
        values = _exact_quantiles(conn, info, wanted)
    bounds, literals, array_literal = _typed_bounds(conn, info, thin(values, wanted))
    if list(bounds) != sorted(set(bounds)):
        raise PartitionError(f"bounds of {schema}.{table}.{column} are not strictly increasing")
    log.debug("partition %s.%s.%s: %d bounds", schema, table, column, len(bounds))
    return RangePartition(schema, table, column, info.type_name, bounds, literals, array_literal)


def _exact_quantiles(conn: psycopg.Connection[Any], info: ColumnInfo, wanted: int) -> list[Any]:
    fractions = [i / (wanted + 1) for i in range(1, wanted + 1)]
    quantiles = sql.SQL("(SELECT percentile_disc(%s::float8[]) WITHIN GROUP (ORDER BY {})"
                        " FROM {})").format(sql.Identifier(info.column),
                                            sql.Identifier(info.schema, info.table))
    row = conn.execute(sql.SQL("SELECT {}").format(_finite(quantiles, info.value_type)),
                       (fractions,)).fetchone()
    if row is None or row[0] is None:
        return []
    return sorted({v for v in row[0] if v is not None})
