"""Reading deltas from the audit tables of ``pg_extensions/002_audit.sql`` (DESIGN §5–6).

The delta of table T since version ``V`` (a ``pg_snapshot``) is the set of audit rows whose
transaction is *not* visible in V, read in the caller's current snapshot S; the new version is
``pg_current_snapshot()`` of that same snapshot. This is exact under concurrency, where
sequence or xid order is not commit order. It requires ``V ⊆ S`` (every transaction visible in
V is visible in S): otherwise rows would have to be *subtracted* that S cannot even see, and
:class:`VersionAhead` is raised (the caller recaptures or uses an older state).

All functions take a psycopg connection that is already inside the right transaction: REPEATABLE
READ or SERIALIZABLE (one snapshot for every statement), e.g. the client's exported snapshot.

Fragment ids are computed in SQL (``coalesce(width_bucket(a, bounds::type[]), n + 1)``, see
:class:`sketches.ranges.RangePartition`), and filters are pushed into the fetch, so Python never
has to reproduce PostgreSQL's comparison semantics.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import psycopg
from psycopg import sql

import pg_extensions
from sketches import freshness, pipelined

log = logging.getLogger(__name__)


class DeltaError(Exception):
    """Base class of delta-reading errors."""


class NotTracked(DeltaError):
    """The table has no audit table visible in this snapshot: call ``imp.track_table`` in a
    transaction that commits before the snapshot used to build the state."""


class Unguarded(NotTracked):
    """Schema imp has no DDL guard (its event triggers, ``pg_extensions.ddl_guarded``): an
    ``ALTER … TYPE … USING`` would change rows the audit never sees, so nothing is tracked or
    maintained incrementally; recapture stays exact."""


class SnapshotRequired(DeltaError):
    """The connection is not inside a REPEATABLE READ / SERIALIZABLE transaction."""


class RoundedFloats(DeltaError):
    """The session's ``extra_float_digits`` is 0 or less: PostgreSQL prints float values
    rounded to 15 digits, which the engine would read as other numbers (found: rows of
    ``0.1 + 0.2`` read as ``0.3`` and counted in ``x > 0.3``'s group where PostgreSQL keeps
    them out: a maintained sketch missed them)."""


class OwnWrites(DeltaError):
    """The current transaction itself wrote audit rows of the table: its changes are not
    committed, so no sketch version can include them (DESIGN §5: pass the query through)."""


class AuditRebuilt(DeltaError):
    """The audit table read by name was created after this transaction's snapshot (DDL on the
    base table rebuilt it): the deltas committed before the rebuild are not in it, while the
    epoch read in this snapshot is still the old one. The state must be recaptured."""


class VersionAhead(DeltaError):
    """The state's version sees a transaction the current snapshot does not (V ⊄ S)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A parsed ``pg_snapshot`` (``xmin:xmax:xip,…``)."""

    xmin: int
    xmax: int
    xip: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> Snapshot:
        try:
            xmin, xmax, xip = text.split(":")
            return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))
        except ValueError as exc:
            raise ValueError(f"not a pg_snapshot: {text!r}") from exc

    def visible(self, xid: int) -> bool:
        """``pg_visible_in_snapshot`` for a completed transaction id."""
        return xid < self.xmin or (xid < self.xmax and xid not in self.xip)

    def within(self, other: Snapshot) -> bool:
        """True when every xid visible here is visible in ``other`` (``self ⊆ other``)."""
        # an xid visible here but not in ``other`` is in other.xip or in [other.xmax, xmax);
        # more xids in that range than this snapshot lists as running: one of them is visible
        # here (and not in ``other``), so the range is never built for a long-stale ``other``
        if self.xmax - max(other.xmax, self.xmin) > len(self.xip):
            return False
        candidates = set(other.xip) | set(range(other.xmax, self.xmax))
        return all(not self.visible(x) or other.visible(x) for x in candidates)


@dataclass(frozen=True, slots=True)
class TableInfo:
    """A tracked table as this snapshot sees it."""

    relid: int
    audit_table: str
    epoch: int
    bypassed: bool = False
    """Writes can reach the table without firing its audit's statement triggers (the probe's
    answer; other readers leave it False): it has inheritance children or partitions, whose
    own writes its triggers never see, or is one, whose rows a write naming the parent changes;
    or a logical-replication subscription writes it, whose apply worker fires row-level
    triggers only."""
    collected: str | None = None
    """The table's garbage-collection watermark (``imp.collected``, the probe's answer; None:
    nothing collected, or another reader): every audit row ``imp.gc_deltas`` ever deleted has
    an ``_xid`` visible in it. A state whose version does not contain it may have lost rows
    it still had to apply (``Pipeline.apply`` refuses it)."""


_EXACT_FLOATS = "current_setting('extra_float_digits')::int > 0"
"""SQL: does the session print floats exactly (:class:`RoundedFloats`)?"""


def require_snapshot(conn: psycopg.Connection[Any]) -> str:
    """The current transaction's snapshot; raises :class:`SnapshotRequired` if statements of
    this transaction may see different snapshots."""
    row = conn.execute("SELECT pg_current_snapshot()::text,"
                       " current_setting('transaction_isolation'), " + _EXACT_FLOATS).fetchone()
    assert row is not None
    # checked after the statement: psycopg opens its transaction lazily, on the first one
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.INTRANS:
        raise SnapshotRequired("deltas must be read inside an open transaction")
    _check_session(row[1], row[2])
    return str(row[0])


def _check_session(iso: str, exact_floats: bool) -> None:
    if iso not in ("repeatable read", "serializable"):
        raise SnapshotRequired(f"isolation level {iso!r}: needs REPEATABLE READ")
    if not exact_floats:
        raise RoundedFloats("extra_float_digits is 0 or less: floats are read rounded")


AUDIT_TRIGGERS = ("imp_audit_ins", "imp_audit_del", "imp_audit_upd", "imp_audit_trunc")
"""The triggers ``imp.track_table`` puts on a tracked table (pg_extensions/002_audit.sql)."""


def audited(relid: str) -> str:
    """SQL: the table ``relid`` (an SQL expression) has every audit trigger, enabled ALWAYS
    (``imp._audited`` in pg_extensions/002_audit.sql says the same). Why: schema imp restored
    from an older dump of the same database brought its tracking rows and audit tables back,
    but not the triggers, which a restore's drop of the audit tables had taken from the table
    (found by a helper's search: an unaudited write, and a sketch used after it lacked its
    group)."""
    names = ", ".join(f"'{n}'" for n in AUDIT_TRIGGERS)
    return (f"(SELECT count(*) FROM pg_catalog.pg_trigger AS g WHERE g.tgrelid = {relid}"
            f" AND g.tgname IN ({names}) AND g.tgenabled = 'A') = {len(AUDIT_TRIGGERS)}")


WITH_AUDIT_TABLE = ("EXISTS (SELECT 1 FROM pg_catalog.pg_class AS c WHERE c.oid = audit_table)"
                    " AND " + audited("relid"))
"""SQL: an ``imp.tracked_tables`` row's audit table exists and its table has its audit
triggers — a tracking row counts only with both (see :class:`Probe`)."""


def table_info(conn: psycopg.Connection[Any], table: str | int) -> TableInfo:
    """Audit table and epoch of ``table`` (regclass text, resolved via search_path, or oid)."""
    if isinstance(table, int):
        query = sql.SQL("SELECT relid::bigint, audit_table::text, epoch FROM imp.tracked_tables"
                        " WHERE relid = {}::oid AND " + WITH_AUDIT_TABLE).format(sql.Literal(table))
    else:
        query = sql.SQL("SELECT relid::bigint, audit_table::text, epoch FROM imp.tracked_tables"
                        " WHERE relid = to_regclass({})::oid AND " + WITH_AUDIT_TABLE
                        ).format(sql.Literal(table))
    try:
        row = conn.execute(query).fetchone()
    except psycopg.errors.UndefinedTable as exc:
        raise NotTracked("schema imp is not installed") from exc
    if row is None:
        raise NotTracked(f"{table} is not tracked in this snapshot")
    return TableInfo(int(row[0]), str(row[1]), int(row[2]))


@dataclass(frozen=True, slots=True)
class Probe:
    """What one maintenance needs to know before fetching, read by a single statement.

    ``snapshot``: ``pg_current_snapshot()``; ``has_xid``: the transaction has an xid (only
    then can it have written audit rows: :func:`check_own_writes` is needed); ``tables``: the
    tracking rows of the asked tables visible in this snapshot (absent: not tracked — also a
    row whose audit table is gone, dropped with the guard off: found, such a table failed
    every prepare and was never sketched again; and a row whose table lacks its audit
    triggers, :func:`audited`; ``imp.track_table`` tracks both afresh)."""

    snapshot: str
    has_xid: bool
    tables: dict[int, TableInfo]


_PROBE = sql.SQL(
    "SELECT s.snap, s.iso, s.has_xid, s.exact_floats, s.guarded, t.relid::bigint,"
    " (SELECT format('%I.%I', n.nspname, c.relname) FROM pg_catalog.pg_class AS c"
    "  JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace"
    "  WHERE c.oid = t.audit_table AND " + audited("t.relid") + "), t.epoch,"
    " EXISTS (SELECT 1 FROM pg_catalog.pg_inherits AS h"
    "  WHERE h.inhparent = t.relid OR h.inhrelid = t.relid)"
    " OR EXISTS (SELECT 1 FROM pg_catalog.pg_subscription_rel AS r WHERE r.srrelid = t.relid),"
    " (SELECT w.bound::text FROM imp.collected AS w WHERE w.relid = t.relid),"
    " {visible}"
    " FROM (SELECT pg_current_snapshot()::text AS snap,"
    " current_setting('transaction_isolation') AS iso,"
    " pg_current_xact_id_if_assigned() IS NOT NULL AS has_xid, "
    + _EXACT_FLOATS + " AS exact_floats, (" + pg_extensions.GUARDED + ") AS guarded) AS s"
    " LEFT JOIN imp.tracked_tables AS t ON t.relid::bigint = ANY({relids}::bigint[])")

_AUDITS_VISIBLE = sql.SQL(
    "(SELECT array_agg(EXISTS (SELECT 1 FROM pg_catalog.pg_class"
    " WHERE oid = to_regclass(u.n)) ORDER BY u.i)"
    " FROM unnest({}::text[]) WITH ORDINALITY AS u(n, i))")


@lru_cache(maxsize=256)
def _probe_query(relids: tuple[int, ...], audits: tuple[str, ...] | None) -> bytes:
    """The probe of ``relids``, and when ``audits`` is given the check of
    :func:`_check_audits_visible` as its last column.

    Why literals, not parameters: a statement without parameters keeps one generic plan once
    psycopg has prepared it, where PostgreSQL re-plans an array parameter on every call (the
    catalog joins make that most of the probe's time). Rendered once (ASCII: numbers and the
    quoted names imp.track_table gives audit tables)."""
    visible = sql.NULL if audits is None else _AUDITS_VISIBLE.format(sql.Literal(list(audits)))
    return _PROBE.format(visible=visible, relids=sql.Literal(list(relids))).as_bytes(None)


def probe(conn: psycopg.Connection[Any], relids: Sequence[int]) -> Probe:
    """:func:`require_snapshot`, :func:`table_info` of every ``relids`` and whether the own-writes
    check is needed, in one round trip (all in the snapshot of this transaction).

    A transaction without an xid has written nothing, so no audit row can carry its xid:
    :func:`check_own_writes` would find none (``_xid = NULL`` is never true)."""
    try:
        rows = conn.execute(_probe_query(tuple(relids), None)).fetchall()
    except psycopg.errors.UndefinedTable as exc:
        raise NotTracked("schema imp is not installed") from exc
    return _probe_result(conn, rows)


def _probe_result(conn: psycopg.Connection[Any], rows: list[tuple[Any, ...]]) -> Probe:
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.INTRANS:
        raise SnapshotRequired("deltas must be read inside an open transaction")
    snap, iso, has_xid, exact_floats, guarded = rows[0][:5]
    _check_session(iso, exact_floats)
    if not guarded:
        raise Unguarded("schema imp has no DDL guard (its event triggers are missing or not"
                        " enabled ALWAYS)")
    tables = {int(r[5]): TableInfo(int(r[5]), str(r[6]), int(r[7]), bool(r[8]),
                                   None if r[9] is None else str(r[9]))
              for r in rows if r[5] is not None and r[6] is not None}
    return Probe(str(snap), bool(has_xid), tables)


def ensure_tracked(conn: psycopg.Connection[Any], table: str) -> TableInfo:
    """Starts tracking ``table`` (``imp.track_table``). Run it in its own transaction and
    commit before taking the snapshot that builds state: only then does that snapshot see
    every write the triggers missed (CREATE TRIGGER waits for the table's running writers)."""
    freshness.note_ddl(conn)
    conn.execute("SELECT imp.track_table(to_regclass(%s))", (table,))
    return table_info(conn, table)


def audit_source(info: TableInfo) -> sql.Composable:
    """The audit table as a FROM item (its name is built by imp.track_table, already quoted)."""
    schema, _, name = info.audit_table.partition(".")
    return sql.Identifier(schema, name.strip('"'))


def check_own_writes(conn: psycopg.Connection[Any], info: TableInfo) -> None:
    row = conn.execute(sql.SQL(
        "SELECT EXISTS (SELECT 1 FROM {} WHERE _xid = pg_current_xact_id_if_assigned())")
        .format(audit_source(info))).fetchone()
    if row is not None and row[0]:
        raise OwnWrites(f"this transaction wrote to table {info.relid}")


def delta_filter(alias: str, since: str) -> sql.Composable:
    """``NOT pg_visible_in_snapshot(alias._xid, since)``, with an index-friendly lower bound."""
    return _delta_filter(sql.Identifier(alias, "_xid"),
                         sql.SQL("{}::pg_snapshot").format(sql.Literal(since)))


def _delta_filter(xid: sql.Composable, since: sql.Composable) -> sql.Composable:
    return sql.SQL("({xid} >= pg_snapshot_xmin({v}) AND NOT pg_visible_in_snapshot({xid}, {v}))"
                   ).format(xid=xid, v=since)


@dataclass(frozen=True, slots=True)
class DeltaQuery:
    """The delta fetch of one table with the version as the parameter ``%(since)s``.

    Why a parameter: the text stays the same from one maintenance to the next, so psycopg
    prepares it once and PostgreSQL stops planning it every time."""

    relid: int
    audit_table: str
    text: bytes
    also: tuple[tuple[int, str], ...] = ()
    """(relid, audit table) of further tables the query reads (a join's pre-aggregated delta)."""
    setup: bytes | None = None
    """A statement (parameter ``%(since)s``) to run right before the fetch, under
    :func:`read_settings`: planner settings that depend on the delta's size, and
    :data:`READ_SETTINGS`."""

    @property
    def tuned(self) -> bool:
        """Run it with :func:`read_settings` (a query joining base tables, which has a setup:
        its plan matters)."""
        return self.setup is not None

    @property
    def audits(self) -> tuple[tuple[int, str], ...]:
        return ((self.relid, self.audit_table), *self.also)


def escaped(conn: psycopg.Connection[Any], part: sql.Composable) -> sql.Composable:
    """``part`` rendered with ``%`` doubled: literal text inside a query that has parameters."""
    return sql.SQL(part.as_string(conn).replace("%", "%%"))


def param_delta_filter(conn: psycopg.Connection[Any], alias: str) -> sql.Composable:
    """:func:`delta_filter` with the version as the parameter ``%(since)s`` (see
    :class:`DeltaQuery`), ready to join other :func:`escaped` parts."""
    return _delta_filter(escaped(conn, sql.Identifier(alias, "_xid")),
                         sql.SQL("%(since)s::pg_snapshot"))


def delta_query(conn: psycopg.Connection[Any], info: TableInfo, alias: str,
                columns: Sequence[sql.Composable],
                where: Sequence[sql.Composable] = ()) -> DeltaQuery:
    """The query of :func:`fetch` (same ``columns`` and ``where``) as a :class:`DeltaQuery`."""
    cond = sql.SQL(" AND ").join(
        [param_delta_filter(conn, alias),
         *(escaped(conn, w) for w in where)])
    cols = [escaped(conn, c) for c in [*columns, sql.Identifier(alias, "_mult")]]
    query = sql.SQL("SELECT {cols} FROM {audit} AS {alias} WHERE {cond}").format(
        cols=sql.SQL(", ").join(cols), audit=escaped(conn, audit_source(info)),
        alias=escaped(conn, sql.Identifier(alias)), cond=cond)
    return DeltaQuery(info.relid, info.audit_table, query.as_bytes(conn))


def fetch(conn: psycopg.Connection[Any], info: TableInfo, alias: str,
          columns: Sequence[sql.Composable], since: str,
          where: Sequence[sql.Composable] = ()) -> list[tuple[Any, ...]]:
    """The delta rows of one table since ``since``: ``(*columns, _mult)``.

    ``columns`` and ``where`` are SQL expressions over ``alias`` (the audit table carries the
    base table's column names and types, so expressions written for the base table work as
    they are — including a fragment id ``RangePartition.fragment_sql``). ``where`` is the
    pushed-down selection. The caller checks ``V ⊆ S`` (:meth:`Snapshot.within`)."""
    return fetch_query(conn, delta_query(conn, info, alias, columns, where), since)


def fetch_query(conn: psycopg.Connection[Any], query: DeltaQuery,
                since: str) -> list[tuple[Any, ...]]:
    """:func:`fetch` of a query built before (its table's tracking unchanged since)."""
    if query.setup is not None:  # the caller runs a query with a setup in read_settings
        conn.execute(query.setup, {"since": since})
    rows = conn.execute(query.text, {"since": since}).fetchall()
    _check_audits_visible(query.audits, conn.execute(_visible_query(query.audits)).fetchone())
    log.debug("table %s: %d delta rows since %s", query.relid, len(rows), since)
    return rows


def _visible_query(audits: Sequence[tuple[int, str]]) -> sql.Composed:
    """The check of :func:`_check_audits_visible` for ``audits`` ((relid, audit table) pairs):
    one statement, to run after the fetches that read them."""
    return sql.SQL("SELECT {}").format(
        _AUDITS_VISIBLE.format(sql.Literal([a for _relid, a in audits])))


def _check_audits_visible(audits: Sequence[tuple[int, str]],
                          row: tuple[Any, ...] | None) -> None:
    """Raises :class:`AuditRebuilt` unless every audit table just read existed in this snapshot
    (``row``: a row whose last column is the check of :func:`_visible_query`).

    Why after the fetch: the fetch holds ACCESS SHARE on the table it resolved by name until
    the transaction ends, so no DDL can replace it any more; ``to_regclass`` resolves the name
    through the latest catalog (that same table), while the ``pg_class`` scan sees this
    transaction's snapshot. A table created after the snapshot is invisible to the scan."""
    flags = list(row[-1]) if row and row[-1] else []
    for i, (relid, audit_table) in enumerate(audits):
        if i >= len(flags) or not flags[i]:
            raise AuditRebuilt(f"audit table {audit_table} of table {relid} was rebuilt "
                               "after this snapshot was taken")


_SAVEPOINT = b"SAVEPOINT _imp_deltas"
READ_SETTINGS = ("set_config('max_parallel_workers_per_gather', '0', true),"
                 " set_config('jit', 'off', true)")
"""Columns of a tuned query's setup (:class:`DeltaQuery`), in effect for its fetch and every
read after it until :func:`read_settings` or :func:`read_batch` undoes them (with the
setup's own ``enable_nestloop`` and ``plan_cache_mode``: :func:`sketches.ivm.partials.query`).

Why: a parallel plan launches workers even where a one-time filter is false; JIT compiles
for estimates, not rows. The setup itself is planned before they take effect, so it may keep
a generic plan."""
_UNDO = (b"ROLLBACK TO SAVEPOINT _imp_deltas", b"RELEASE SAVEPOINT _imp_deltas")
_INTRANS = psycopg.pq.TransactionStatus.INTRANS


@contextmanager
def read_settings(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Delta reads in a savepoint, undone on exit (ROLLBACK TO SAVEPOINT reverts the
    :data:`READ_SETTINGS` of a tuned query's setup; the reads wrote nothing), so the caller's
    transaction keeps its own settings."""
    conn.execute(_SAVEPOINT)
    try:
        yield
    finally:
        for stmt in _UNDO:
            conn.execute(stmt)


@dataclass(frozen=True, slots=True)
class Statement:
    """A read to run with the delta reads (:func:`read_batch`), prepared: a fixed ``text``
    (``%s`` placeholders) and its ``params``."""

    text: str
    params: tuple[Any, ...] = ()


Rows = list[tuple[Any, ...]]


def run(conn: psycopg.Connection[Any], st: Statement) -> Rows:
    return pipelined.fetch(conn, st.text, st.params)


def read_batch(conn: psycopg.Connection[Any], relids: Sequence[int],
               queries: Sequence[DeltaQuery], since: str,
               also: Sequence[Statement] = ()) -> tuple[Probe, list[Rows], list[Rows]] | None:
    """:func:`fetch_query` of every query, then :func:`probe` with the visibility check of
    the audit tables read, in one round trip.

    Pipelined inside a savepoint: a fetch that fails (its audit table dropped since the query
    was built) rolls back to it, leaving the caller's transaction usable, and returns None
    (a data exception, SQLSTATE class 22, is raised after the rollback instead),
    as does a probe showing another audit table for a query's table. On None the caller goes
    the long way (probe first), which reports what changed. The probe may come last: every
    statement of the transaction reads the same snapshot, and the visibility check must
    follow the fetches (:func:`_check_audits_visible`). ``also`` run after the probe, their
    rows returned third (a failing one makes the result None too). Queries with a setup run
    last (its :data:`READ_SETTINGS` stay in effect for the reads after it; the others keep
    generic plans), and the savepoint is then rolled back to, as in :func:`read_settings`.

    The batch goes out as one libpq pipeline (:mod:`sketches.pipelined`: psycopg's pipeline
    API cost as much client time as the server's work for a small delta), and the reads are
    named statements prepared once per connection (unless its ``prepare_threshold`` is None):
    a sketch's maintenances repeat the same texts, and parsing and planning them is most of
    PostgreSQL's time for a small delta. A statement that fails is prepared anew on its next
    run."""
    if conn.info.transaction_status != _INTRANS:
        return None
    audits = list(dict.fromkeys(a for q in queries for a in q.audits))
    check = _probe_query(tuple(relids), tuple(a for _relid, a in audits))
    tuned = any(q.tuned for q in queries)
    since_b = since.encode()
    steps = [pipelined.Step(_SAVEPOINT, prepared=False)]
    at: dict[int, int] = {}
    for i in sorted(range(len(queries)), key=lambda i: queries[i].tuned):
        q = queries[i]
        if q.setup is not None:
            steps.append(pipelined.Step(_dollar(q.setup), (since_b,)))
        at[i] = len(steps)
        steps.append(pipelined.Step(_dollar(q.text), (since_b,)))
    probe_at = len(steps)
    steps.append(pipelined.Step(check))
    steps += [pipelined.bound(conn, _dollar(st.text.encode()), st.params) for st in also]
    steps += [pipelined.Step(u, prepared=False) for u in (_UNDO if tuned else _UNDO[1:])]
    try:
        out = pipelined.run(conn, steps)
    except psycopg.Error as exc:
        if isinstance(exc, psycopg.DataError) and exc.sqlstate is None \
                and conn.info.transaction_status == _INTRANS:
            raise   # a value psycopg cannot load: every step ran, the savepoint is gone
        log.debug("pipelined delta read failed (%s): probing first", exc)
        for stmt in _UNDO:
            conn.execute(stmt)
        if exc.sqlstate is not None and exc.sqlstate.startswith("22"):
            # a value raised (the caller's transaction is usable): so would the long way
            raise (exc.error if isinstance(exc, pipelined.BatchFailed) else exc) from None
        return None
    rows = out[probe_at] or []
    probe = _probe_result(conn, rows)
    for relid, audit_table in audits:
        info = probe.tables.get(relid)
        if info is None or info.audit_table != audit_table:
            return None
    _check_audits_visible(audits, rows[0])
    return (probe, [out[at[i]] or [] for i in range(len(queries))],
            [out[probe_at + 1 + k] or [] for k in range(len(also))])


@lru_cache(maxsize=1024)
def _dollar(text: bytes) -> bytes:
    return pipelined.dollar(text)


def any_since(conn: psycopg.Connection[Any], info: TableInfo, since: str) -> bool:
    """Is there an audit row not covered by ``since``? (Newest first down the ``_xid``
    index: the rows after a version are the newest.)"""
    row = conn.execute(sql.SQL("SELECT 1 FROM {} AS d WHERE {} ORDER BY d._xid DESC LIMIT 1")
                       .format(audit_source(info), delta_filter("d", since))).fetchone()
    return row is not None


def pending(conn: psycopg.Connection[Any], info: TableInfo, since: str) -> int:
    """Number of audit rows not covered by ``since`` (for batch-size trigger policies)."""
    row = conn.execute(sql.SQL("SELECT count(*) FROM {} AS d WHERE {}").format(
        audit_source(info), delta_filter("d", since))).fetchone()
    return int(row[0]) if row else 0
