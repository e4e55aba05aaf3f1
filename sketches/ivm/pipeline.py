"""A compiled incremental pipeline bound to PostgreSQL (see :mod:`sketches.ivm.plan`).

Lifecycle (all calls take a connection inside a REPEATABLE READ transaction; the pipeline
never commits):

* ``build_state(conn, seed=None)`` at capture: pushed-down queries (``GROUP BY g, fragment`` partial
  aggregates, top-l value multisets for min/max, top-l rows WITH TIES for top-k) fill the
  operators' state; the version becomes ``pg_current_snapshot()``. Every table must be tracked
  (``imp.track_table``) in a transaction committed before this snapshot was taken. A ``seed``
  (``sketches.backends.base.AggregateState`` built by Spark in the same snapshot) replaces the
  aggregate operator's queries.
* ``maintain(conn) -> SketchDelta``: fetches the deltas since the version in conn's snapshot,
  steps the operators, advances the version. A query calls it in its own snapshot. Its two
  halves, ``read`` (with further statements in the same round trip) and ``apply``, let a
  caller look at what it read before the state changes.
* ``sketch()``: the current fragment sets (one per target, in target order).
* ``snapshot()`` / ``restore()``: JSON-able state (see :mod:`sketches.ivm.state`).
* ``add_head(spec)``: a further sketch over the same aggregation (a query that differs only in
  its HAVING, or only in the k of a top-k over groups) maintained by the same steps: its own
  HAVING or k and its own merge, one aggregate state (and one top-k buffer).

Any exception inside ``maintain`` after the first operator stepped leaves the in-memory state
half-updated: the pipeline marks itself broken and later calls raise :class:`PipelineBroken`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from sketches import cost, deltas
from sketches.ivm import collector, partials
from sketches.ivm.codec import Json
from sketches.ivm.errors import (
    DeltaRaised,
    Invalidated,
    NotMaintainable,
    PipelineBroken,
    StateFormatError,
    StateTooLarge,
)
from sketches.ivm.keyfilter import KeyFilter
from sketches.ivm.ops.accumulators import best_values
from sketches.ivm.ops.aggregate import Aggregate, HavingTest
from sketches.ivm.ops.distinct import Distinct
from sketches.ivm.ops.having import Having
from sketches.ivm.ops.join import Join, Key
from sketches.ivm.ops.merge import Merge, SketchDelta
from sketches.ivm.ops.project import Project
from sketches.ivm.ops.scan import Scan
from sketches.ivm.ops.topk import TopK, best_with_ties
from sketches.ivm.plan import PlanSpec, TableSpec
from sketches.ivm.zset import Ann, Entry, Row, ZSet

if TYPE_CHECKING:
    from sketches.backends.base import AggregateState

log = logging.getLogger(__name__)

FORMAT = 2
"""Of the state :meth:`Pipeline.snapshot` makes. 2: its long lists persisted in slices
(``sketches.ivm.codec.dumps``), which a proxy reading format 1 refuses cleanly (it rebuilds
the state); 1, the same state unsliced, is still read."""
_READ_FORMATS = (1, 2)
Conn = psycopg.Connection[Any]


@contextmanager
def _python_values() -> Iterator[None]:
    """Refuses, as :class:`NotMaintainable`, a value psycopg cannot load into Python (a
    timestamp or date of ±infinity, a year past 9999): such a client-side DataError (no
    SQLSTATE) leaves the transaction usable, and the sketch then recaptures (PostgreSQL
    computes it). Without this, every query of the sketch failed its preparation anew."""
    try:
        yield
    except psycopg.DataError as exc:
        if exc.sqlstate is not None:
            raise
        raise NotMaintainable(f"a value Python cannot hold: {exc}") from exc


def _test(having: Having | None) -> HavingTest | None:
    return None if having is None else (having.test, having.columns, having.predicate)


def _raw(text: str) -> sql.Composable:
    return sql.SQL(text)  # analysed SQL printed by pglast, parameters already bound


def _cond(text: str) -> sql.Composable:
    """A pushed-down conjunct, parenthesised for joining with AND."""
    return sql.SQL("({})").format(_raw(text))


def _in_list(exprs: Sequence[str], keys: set[Key]) -> sql.Composable:
    lits = [sql.SQL("({})").format(sql.SQL(", ").join(sql.Literal(v) for v in k))
            for k in sorted(keys, key=repr)]
    return sql.SQL("({}) IN ({})").format(sql.SQL(", ").join(_raw(e) for e in exprs),
                                          sql.SQL(", ").join(lits))


class _PgJoinBackend:
    """R' and S' of join ``step`` live in PostgreSQL; partner rows come from the snapshot."""

    def __init__(self, pipeline: Pipeline, step: int) -> None:
        self.pipeline = pipeline
        self.step = step

    def advance(self, left: ZSet, right: ZSet) -> None:
        """Nothing to do: PostgreSQL's snapshot already holds the new state."""

    def _filtered(self, keys: set[Key], side: int) -> set[Key]:
        filt = self.pipeline.filters[self.step][side]
        if filt is None:
            return keys
        kept = {k for k in keys if k[0] in filt}
        self.pipeline.stats["keys_filtered"] += len(keys) - len(kept)
        if not kept:
            self.pipeline.stats["lookups_skipped"] += 1
        return kept

    def left_matching(self, keys: set[Key]) -> ZSet:
        js = self.pipeline.spec.joins[self.step]
        keys = self._filtered(keys, 0)
        if not keys:
            return ZSet()
        return self.pipeline.current(range(self.step + 1), [_in_list(js.left_sql, keys)])

    def right_matching(self, keys: set[Key]) -> ZSet:
        js = self.pipeline.spec.joins[self.step]
        keys = self._filtered(keys, 1)
        if not keys:
            return ZSet()
        return self.pipeline.current([self.step + 1], [_in_list(js.right_sql, keys)])


@dataclass(eq=False)
class Head:
    """A further sketch of a pipeline (:meth:`Pipeline.add_head`): the plan of its query, its
    HAVING (a head of a pipeline without top-k) or its ``k`` (a head of a top-k over groups)
    and its merge. Compared by identity."""

    spec: PlanSpec
    having: Having | None
    merge: Merge

    @property
    def k(self) -> int | None:
        return self.spec.k

    def step(self, out: ZSet) -> SketchDelta:
        """Merges the aggregate's output delta ``out`` that passes this head's HAVING."""
        return self.merge.step(out if self.having is None else self.having.step(out))


@dataclass(frozen=True, slots=True)
class DeltaRead:
    """What :meth:`Pipeline.read` read: from the state's version ``since`` to ``snapshot``
    (conn's), the delta ``rows`` as :meth:`Pipeline.apply` takes them, and the rows of each
    statement asked for alongside (``also``)."""

    since: str
    snapshot: str
    rows: list[deltas.Rows]
    also: list[deltas.Rows]
    collected: tuple[str, ...] = ()
    """The garbage-collection watermarks of the tables read (:attr:`deltas.TableInfo.collected`,
    those that have one), checked by :meth:`Pipeline.apply` against ``since``."""


def _check_collected(read: DeltaRead) -> None:
    """Raises :class:`Invalidated` unless every table's garbage-collection watermark is within
    the state's version ``read.since``: only then was every audit row deleted so far already
    applied to the state (each had an xid visible in the watermark, so in the version).

    Why: a state no garbage collection knew of — held in memory by a second proxy while the
    first dropped the sketch, whose persisted row then protected nothing — lost rows it had
    still to apply (found: a group missing from a HAVING answer). Checked here, not in
    :meth:`Pipeline.read`: a caller may load a newer persisted state after reading and read
    again (``SketchManager._catch_up_and_maintain``); the version applied to is what counts."""
    since = deltas.Snapshot.parse(read.since)
    for watermark in read.collected:
        if not deltas.Snapshot.parse(watermark).within(since):
            raise Invalidated(f"audit rows the state at {read.since} had not applied were "
                              f"collected (up to {watermark})")


class Pipeline:
    def __init__(self, spec: PlanSpec) -> None:
        self.spec = spec
        self.version: str | None = None
        self.relids: tuple[int, ...] = ()
        self.epochs: tuple[int, ...] = ()
        self.broken = False
        self.stats: dict[str, int] = {"keys_filtered": 0, "lookups_skipped": 0}
        self.filters: list[tuple[KeyFilter | None, KeyFilter | None]] = []
        self.max_rows: int | None = None
        """The most rows one query of a state build may return, else :class:`NotMaintainable`
        (the sketch is kept by recapture): the state's memory grows with them, about 0.9 KiB
        per group (found by a helper's search of resource bounds in session 26: 1M groups
        took 1.2 GiB, and nothing stopped 10M)."""
        self.built_rows = 0
        """Rows the last :meth:`build_state` read (its queries' results): how large the state
        is, for a caller deciding whether to persist it at once."""
        self.applied = 0
        """Size of the last ``maintain``'s delta as the operators took it: delta rows, or
        pre-aggregated (group, fragments) changes; at least 1 when any table had delta rows
        passing its WHERE, even if a join made nothing of them (0: no delta)."""
        self.refilled = 0
        """Min/max value buffers and top-k buffers the last ``maintain`` refilled (exactly,
        from PostgreSQL or from the aggregate's state) because a delta ran them dry."""
        self._conn: Conn | None = None
        self._queries: list[deltas.DeltaQuery] | None = None
        self._layout = partials.Layout()   # of the pre-aggregated query in _queries
        self._reset()

    def _reset(self) -> None:
        """Fresh operators (empty state)."""
        spec = self.spec
        s = spec.slots
        self.scans = [Scan(s, t.slot, len(t.payload) if t.slot is not None else None)
                      for t in spec.tables]
        self.joins = [Join(j.left_key, j.right_key, _PgJoinBackend(self, i))
                      for i, j in enumerate(spec.joins)]
        self.aggregate: Aggregate | None = None
        self.having: Having | None = None
        self.order_project: Project | None = None
        self.distinct_project: Project | None = None
        self.distinct: Distinct | None = None
        self.topk: TopK | None = None
        opts = spec.options
        if spec.kind == "aggregate":
            self.aggregate = Aggregate(spec.group_by, spec.aggs, s, scalar=spec.scalar,
                                       buffer_limit=opts.minmax_buffer, refill=self._refill_values)
            self.having = Having(spec.having) if spec.having is not None else None
            if spec.k is not None:
                width = len(spec.group_by) + len(spec.aggs)
                self.order_project = Project([*range(width), *spec.order_exprs])
                self.topk = (TopK(spec.order, spec.k) if spec.scalar else
                             TopK(spec.order, spec.k, buffer_limit=self._topk_limit(),
                                  refill=self._refill_top_groups))
        elif spec.kind == "distinct":
            self.distinct_project = Project(spec.distinct_cols)
            self.distinct = Distinct(len(spec.distinct_cols), s)
            if spec.k is not None:
                self.topk = TopK(spec.order, spec.k)
        elif spec.kind == "topk":
            assert spec.k is not None
            self.topk = TopK(spec.order, spec.k, buffer_limit=self._topk_limit(),
                             refill=self._refill_top)
        self.merge = Merge(s)
        self.heads: list[Head] = []
        self.filters = [(None, None) for _ in spec.joins]

    # ---- SQL over the current snapshot --------------------------------------------------
    def _from_where(self, positions: Sequence[int],
                    extra: Sequence[sql.Composable] = ()) -> sql.Composable:
        tables = [self.spec.tables[p] for p in positions]
        items = sql.SQL(", ").join(
            sql.SQL("{} AS {}").format(_raw(t.source), sql.Identifier(t.alias)) for t in tables)
        # each conjunct parenthesised: "a OR b" joined bare became "a OR (b AND r.x = s.y)"
        conds: list[sql.Composable] = [_cond(w) for t in tables for w in t.where]
        conds += [sql.SQL("{} = {}").format(_raw(x), _raw(y))
                  for pa, x, pb, y in self.spec.equalities if pa in positions and pb in positions]
        conds += list(extra)
        where = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conds) if conds else sql.SQL("")
        return sql.SQL("FROM {}{}").format(items, where)

    def _frag_cols(self, positions: Sequence[int]) -> list[tuple[int, str]]:
        """(slot, fragment SQL) of the sketched tables among ``positions``."""
        return [(t.slot, t.fragment) for t in (self.spec.tables[p] for p in positions)
                if t.slot is not None and t.fragment is not None]

    def _run(self, query: sql.Composed) -> list[tuple[Any, ...]]:
        assert self._conn is not None
        cur = self._conn.execute(query)
        if self.max_rows is not None and cur.rowcount > self.max_rows:
            raise StateTooLarge(f"a state of more than {self.max_rows:,} rows (max_state_rows)")
        rows: list[tuple[Any, ...]] = cur.fetchall()
        self.built_rows += len(rows)
        return rows

    def current(self, positions: Sequence[int], extra: Sequence[sql.Composable] = (),
                order_limit: sql.Composable | None = None) -> ZSet:
        """Annotated rows of the join of ``positions`` in the current snapshot."""
        positions = list(positions)
        cols: list[sql.Composable] = []
        for p in positions:
            t = self.spec.tables[p]
            cols += [_raw(e) for e in t.payload]
            if t.fragment is not None:
                cols.append(_raw(t.fragment))
        query = sql.SQL("SELECT {} {}{}").format(
            sql.SQL(", ").join(cols), self._from_where(positions, extra),
            order_limit if order_limit is not None else sql.SQL(""))
        out = ZSet()
        for r in self._run(query):
            out.add(*self._annotate(positions, r), 1)
        return out

    def _annotate(self, positions: Sequence[int], r: Sequence[Any]) -> tuple[Row, Ann]:
        row: list[Any] = []
        slots: list[frozenset[int]] = [frozenset() for _ in range(self.spec.slots)]
        at = 0
        for p in positions:
            t = self.spec.tables[p]
            row += r[at:at + len(t.payload)]
            at += len(t.payload)
            if t.fragment is not None and t.slot is not None:
                slots[t.slot] = frozenset((int(r[at]),))
                at += 1
        return tuple(row), tuple(slots)

    # ---- capture -------------------------------------------------------------------------
    def track(self, conn: Conn) -> None:
        """``imp.track_table`` for every table; commit before the snapshot of build_state."""
        for t in self.spec.tables:
            deltas.ensure_tracked(conn, t.source)

    def build_state(self, conn: Conn,
                    seed: AggregateState | None = None) -> tuple[frozenset[int], ...]:
        """Builds every operator's state in conn's snapshot; returns the sketch.

        ``seed``: the aggregate operator's state already built elsewhere in this very snapshot
        (the Spark backend, ``RoutedBackend.spark_state``); it replaces the pushed-down
        partial-aggregate queries. A seed of another snapshot or shape is ignored (logged)."""
        if self.heads:
            raise PipelineBroken("a state shared by several sketches is not rebuilt")
        with collector.paused():
            return self._build_state(conn, seed)

    def _build_state(self, conn: Conn,
                     seed: AggregateState | None) -> tuple[frozenset[int], ...]:
        version = deltas.require_snapshot(conn)
        infos = [deltas.table_info(conn, t.source) for t in self.spec.tables]
        seed = self._usable_seed(seed, version)
        self._reset()
        self.built_rows = 0
        self._queries = None
        self._conn = conn
        try:
            with _python_values():
                out = self._initial_output(seed)
            self.merge.step(out)
            self._build_filters()
        finally:
            self._conn = None
        self.version = version
        self.relids = tuple(i.relid for i in infos)
        self.epochs = tuple(i.epoch for i in infos)
        log.debug("built state at %s: %s", version, [len(s) for s in self.sketch()])
        return self.sketch()

    def _filter_columns(self, step: int) -> tuple[tuple[int, int], tuple[int, int]] | None:
        """((table pos, payload index) of the left key, same for the right key) of a join with
        a single-column key, else None (no filter)."""
        js = self.spec.joins[step]
        if not self.spec.options.join_filter or len(js.left_sql) != 1 or len(js.left_pos) != 1:
            return None
        lpos = js.left_pos[0]
        return ((lpos, self.spec.tables[lpos].payload.index(js.left_sql[0])),
                (step + 1, js.right_key[0]))

    def _build_filters(self) -> None:
        """Distinct key values of each side's base table (a superset of the side's keys)."""
        for step in range(len(self.spec.joins)):
            cols = self._filter_columns(step)
            if cols is None:
                continue
            built: list[KeyFilter] = []
            for pos, idx in cols:
                t = self.spec.tables[pos]
                query = sql.SQL("SELECT DISTINCT {} {}").format(
                    _raw(t.payload[idx]), self._from_where([pos]))
                built.append(KeyFilter(r[0] for r in self._run(query)))
            self.filters[step] = (built[0], built[1])

    def _extend_filters(self, fetched: Sequence[ZSet]) -> None:
        """Adds the keys of inserted delta rows (never removes: a superset stays valid)."""
        for step, (left, right) in enumerate(self.filters):
            cols = self._filter_columns(step)
            if cols is None:
                continue
            for filt, (pos, idx) in zip((left, right), cols, strict=True):
                if filt is not None:
                    filt.update(r[idx] for r, _a, w in fetched[pos] if w > 0)

    def _all(self) -> list[int]:
        return list(range(len(self.spec.tables)))

    def _usable_seed(self, seed: AggregateState | None,
                     version: str) -> AggregateState | None:
        if seed is None:
            return None
        functions = tuple(a.func for a in self.spec.aggs)
        if self.spec.kind != "aggregate" or seed.version != version \
                or seed.slots != self.spec.slots or seed.functions != functions:
            log.warning("aggregate state seed from %s ignored (version %s, functions %s, %d"
                        " slot(s); the pipeline needs %s, %s, %d): built in PostgreSQL",
                        seed.backend or "?", seed.version, seed.functions, seed.slots,
                        version, functions, self.spec.slots)
            return None
        return seed

    def _initial_output(self, seed: AggregateState | None = None) -> ZSet:
        spec = self.spec
        frags = self._frag_cols(self._all())
        if self.aggregate is not None:
            if seed is not None:
                seed.load_into(self.aggregate)
            else:
                self._load_aggregate(frags)
            out = self.aggregate.current_output()
            return self._above_aggregate(out)
        if self.distinct is not None:
            cols = [_raw(self._payload_sql(c)) for c in spec.distinct_cols]
            rows = self._grouped(cols, frags, [])
            z = ZSet((tuple(r[:len(cols)]), self._ann(frags, r[len(cols):-1]), int(r[-1]))
                     for r in rows)
            out = self.distinct.step(z)
            return self.topk.step(out) if self.topk is not None else out
        if self.topk is not None:
            self.topk.load(*self._top_rows())
            return self.topk.top()
        rows = self._grouped([], frags, [])
        return ZSet(((), self._ann(frags, r[:-1]), int(r[-1])) for r in rows)

    def _payload_sql(self, pos: int) -> str:
        for t in self.spec.tables:
            if pos < len(t.payload):
                return t.payload[pos]
            pos -= len(t.payload)
        raise IndexError(pos)

    def _ann(self, frags: Sequence[tuple[int, str]], ids: Sequence[Any]) -> Ann:
        slots: list[frozenset[int]] = [frozenset() for _ in range(self.spec.slots)]
        for (slot, _f), fid in zip(frags, ids, strict=True):
            slots[slot] = frozenset((int(fid),))
        return tuple(slots)

    def _grouped(self, keys: Sequence[sql.Composable], frags: Sequence[tuple[int, str]],
                 aggregates: Sequence[sql.Composable],
                 extra: Sequence[sql.Composable] = ()) -> list[tuple[Any, ...]]:
        """``SELECT keys, frags, aggregates, count(*) … GROUP BY keys, frags``."""
        # one row more than the limit tells the build to give up, and no more is sent
        limit = sql.SQL("") if self.max_rows is None else sql.SQL(" LIMIT {}").format(
            sql.Literal(self.max_rows + 1))
        return self._run(self._grouped_sql(keys, frags, aggregates, extra) + limit)

    def _grouped_sql(self, keys: Sequence[sql.Composable], frags: Sequence[tuple[int, str]],
                     aggregates: Sequence[sql.Composable],
                     extra: Sequence[sql.Composable] = ()) -> sql.Composed:
        group = [*keys, *(_raw(f) for _s, f in frags)]
        select = sql.SQL(", ").join([*group, *aggregates, sql.SQL("count(*)")])
        by = (sql.SQL(" GROUP BY ") + sql.SQL(", ").join(
            sql.SQL(str(i + 1)) for i in range(len(group)))) if group else sql.SQL("")
        return sql.SQL("SELECT {} {}{}").format(select, self._from_where(self._all(), extra), by)

    def estimated_groups(self, conn: Conn) -> float | None:
        """PostgreSQL's estimate of the (group, fragment) pairs the aggregation's state would
        hold (planned, not run), or None when the pipeline has no aggregation or the plan
        failed. Why: a state's build time follows its groups, not its tables' rows (the
        background builds large ones, :mod:`sketches.maintained`)."""
        if self.aggregate is None:
            return None
        query = self._grouped_sql([_raw(g) for g in self.spec.group_sql],
                                  self._frag_cols(self._all()), [])
        plan = cost.top_plan(conn, query.as_string(conn))
        return None if plan is None else float(plan["Plan Rows"])

    def _load_aggregate(self, frags: Sequence[tuple[int, str]]) -> None:
        """The aggregate's state from partial aggregates per (group, fragments) — and per
        scale of each avg argument of type numeric without a fixed scale, so every value is
        counted at its scale (``accumulators.SumAcc``). Why per scale: a partial of values of
        several scales shows only the largest, and once deletes removed the values of that
        scale the group's avg could not be maintained any more (a recapture each time)."""
        agg, spec = self.aggregate, self.spec
        assert agg is not None and self._conn is not None
        loose, fixed = partials.scales(self._conn, spec)
        partial_sql: list[sql.Composable] = []
        for a, arg in zip(spec.aggs, spec.agg_sql, strict=True):
            if a.func == "count_star":
                partial_sql.append(sql.SQL("count(*)"))
            elif a.func in ("sum", "avg"):
                partial_sql += [sql.SQL("sum({})").format(_raw(arg or "")),
                                sql.SQL("count({})").format(_raw(arg or ""))]
            else:
                partial_sql.append(sql.SQL("count({})").format(_raw(arg or "")))
        keys = [_raw(g) for g in spec.group_sql]
        keys += [sql.SQL("scale({})").format(_raw(spec.agg_sql[i] or "")) for i in loose]
        ng, nk, nf = len(spec.group_sql), len(keys), len(frags)
        scale_at = {i: ng + k for k, i in enumerate(loose)}   # column of avg i's scale
        for r in self._grouped(keys, frags, partial_sql):
            parts: list[object] = []
            at = nk + nf
            for i, a in enumerate(spec.aggs):
                if a.func in ("sum", "avg"):
                    one = r[scale_at[i]] if i in scale_at else fixed.get(i)
                    parts.append((r[at], r[at + 1], one))
                    at += 2
                else:
                    parts.append(r[at])
                    at += 1
            ids: list[int | None] = [None] * spec.slots
            for (slot, _f), fid in zip(frags, r[nk:nk + nf], strict=True):
                ids[slot] = int(fid)
            agg.absorb_partial(tuple(r[:ng]), ids, int(r[-1]), parts)
        for i, a in enumerate(spec.aggs):
            if a.func in ("min", "max"):
                by_group: dict[Row, list[tuple[object, int]]] = {}
                for r in self._value_rows(i, None):
                    by_group.setdefault(tuple(r[:ng]), []).append((r[ng], int(r[ng + 1])))
                for key in agg.groups:
                    agg.load_values(key, i, *self._best(a.func, by_group.get(key, [])))

    def _best(self, func: str, values: list[tuple[object, int]]
              ) -> tuple[list[tuple[object, int]], bool]:
        return best_values(values, func == "max", self.spec.options.minmax_buffer)

    def _value_rows(self, i: int, key: Row | None) -> list[tuple[Any, ...]]:
        """``g…, v, multiplicity`` of the best ``l + 1`` distinct values of aggregate ``i`` per
        group (of group ``key`` only, if given)."""
        spec = self.spec
        arg = _raw(spec.agg_sql[i] or "")
        gnames = [sql.Identifier(f"_g{j}") for j in range(len(spec.group_sql))]
        extra: list[sql.Composable] = [sql.SQL("{} IS NOT NULL").format(arg)]
        if key is not None:
            extra += [sql.SQL("{} IS NOT DISTINCT FROM {}").format(_raw(g), sql.Literal(v))
                      for g, v in zip(spec.group_sql, key, strict=True)]
        # distinct (group, value) pairs with multiplicities first (hash aggregate), then rank
        # only those: far cheaper than ranking every row
        ng = len(gnames)
        base = sql.SQL("SELECT {}, count(*) AS _m {} GROUP BY {}").format(
            sql.SQL(", ").join([*(sql.SQL("{} AS {}").format(_raw(g), n)
                                  for g, n in zip(spec.group_sql, gnames, strict=True)),
                                sql.SQL("{} AS _v").format(arg)]),
            self._from_where(self._all(), extra),
            sql.SQL(", ").join(sql.SQL(str(j + 1)) for j in range(ng + 1)))
        direction = sql.SQL("DESC" if spec.aggs[i].func == "max" else "ASC")
        part = (sql.SQL("PARTITION BY ") + sql.SQL(", ").join(gnames)) if gnames else sql.SQL("")
        limit = spec.options.minmax_buffer
        cut = (sql.SQL(" WHERE _r <= {}").format(sql.Literal(limit + 1))
               if limit is not None else sql.SQL(""))
        query = sql.SQL(
            "SELECT {g}_v, _m FROM (SELECT *, row_number() OVER ({part} ORDER BY _v {d})"
            " AS _r FROM ({base}) AS b) AS r{cut}").format(
            g=sql.SQL("").join(sql.SQL("{}, ").format(n) for n in gnames),
            part=part, d=direction, base=base, cut=cut)
        return self._run(query)

    def _refill_values(self, key: Row, i: int) -> tuple[list[tuple[object, int]], bool]:
        self.refilled += 1
        ng = len(self.spec.group_sql)
        values = [(r[ng], int(r[ng + 1])) for r in self._value_rows(i, key)]
        return self._best(self.spec.aggs[i].func, values)

    def _top_rows(self) -> tuple[list[Entry], bool]:
        top = self.topk
        assert top is not None and top.buffer_limit is not None
        limit = top.buffer_limit
        tail = sql.SQL(" ORDER BY {} FETCH FIRST {} ROWS WITH TIES").format(
            sql.SQL(", ").join(_raw(o) for o in self.spec.order_sql), sql.Literal(limit + 1))
        z = self.current(self._all(), order_limit=tail)
        count = sum(w for _r, _a, w in z)
        return list(z), count <= limit

    def _refill_top(self) -> tuple[list[Entry], bool]:
        self.refilled += 1
        return self._top_rows()

    def _topk_limit(self) -> int:
        k = self.spec.k
        assert k is not None
        return self.spec.options.topk_buffer or max(2 * k, k + 64)

    def _refill_top_groups(self) -> tuple[list[Entry], bool]:
        """Exact refill of a top-k over groups: its whole current input rebuilt from the
        aggregate's state (already at this batch), no query; O(groups), and needed only when
        a batch drops most of the buffered groups below the bound."""
        self.refilled += 1
        top, agg, project = self.topk, self.aggregate, self.order_project
        assert top is not None and top.buffer_limit is not None
        assert agg is not None and project is not None
        out = agg.current_output()
        if self.having is not None:
            out = self.having.step(out)
        return best_with_ties(project.step(out), top.order, top.buffer_limit)

    def _above_aggregate(self, out: ZSet) -> ZSet:
        """HAVING and top-k over the aggregate's output delta ``out``, and the heads: a head
        of a pipeline without top-k merges ``out`` through its own HAVING, a top-k's head the
        change of its own top (read from the same buffer)."""
        heads = self.heads
        top = self.topk
        if top is None:
            for head in heads:
                head.step(out)
        if self.having is not None:
            out = self.having.step(out)
        if top is not None and self.order_project is not None:
            before = [top.top(h.k) for h in heads]
            out = top.step(out, self.order_project.project_row)
            for head, old in zip(heads, before, strict=True):
                new = top.top(head.k)
                if new != old:
                    head.merge.step(new - old)
        return out

    # ---- maintenance ---------------------------------------------------------------------
    def maintain(self, conn: Conn) -> SketchDelta:
        """Brings the state to conn's snapshot; returns the sketch delta."""
        return self.apply(conn, self.read(conn))

    def read(self, conn: Conn, also: Sequence[deltas.Statement] = ()) -> DeltaRead:
        """The first half of :meth:`maintain`: the deltas since the version in conn's snapshot,
        read without touching the state. ``also``: further statements read in the same round
        trip (their rows in :attr:`DeltaRead.also`), for a caller that decides from them
        whether to :meth:`apply` this read at all."""
        if self.broken:
            raise PipelineBroken("an earlier maintenance failed: rebuild or restore the state")
        if self.version is None:
            raise PipelineBroken("no state: call build_state or restore first")
        with _python_values():
            probe, rows, extra = self._read_deltas(conn, self.version, also)
        collected = tuple(w for relid in self.relids
                          if (w := probe.tables[relid].collected) is not None)
        return DeltaRead(self.version, probe.snapshot, rows, extra, collected)

    def apply(self, conn: Conn, read: DeltaRead) -> SketchDelta:
        """The second half of :meth:`maintain`: steps the operators on ``read`` (taken from
        this state's version, in conn's snapshot) and moves the version."""
        if read.since != self.version or self.broken:
            raise PipelineBroken("the delta was read for another version of the state")
        current, rows = read.snapshot, read.rows
        empty = SketchDelta(*(tuple(frozenset[int]() for _ in range(self.spec.slots)),) * 2)
        self.applied = self.refilled = 0
        if current == self.version:
            return empty
        if not deltas.Snapshot.parse(self.version).within(deltas.Snapshot.parse(current)):
            raise deltas.VersionAhead(f"state at {self.version} is ahead of {current}")
        _check_collected(read)
        if self._preaggregated():
            touched = bool(rows[1][0][0]) if len(rows) > 1 else bool(rows[0])
            return self._step_partials(conn, current, rows[0], touched, empty)
        fetched = [self._delta_zset(t, table_rows)
                   for t, table_rows in zip(self.spec.tables, rows, strict=True)]
        if not any(fetched):
            self.version = current
            return empty
        self.applied = sum(len(z) for z in fetched)

        def step() -> SketchDelta:
            self._extend_filters(fetched)
            return self.merge.step(self._step(fetched))
        return self._advance(conn, current, step)

    def _advance(self, conn: Conn, current: str,
                 step: Callable[[], SketchDelta]) -> SketchDelta:
        """Runs ``step`` (the operators and the merge on one delta) with ``conn`` available for
        refills and partner lookups and moves the version to ``current``. An exception inside
        leaves the pipeline broken: its state may be half-updated."""
        self._conn = conn
        self.broken = True
        try:
            with _python_values():   # refills read values
                change = step()
        finally:
            self._conn = None
        self.broken = False
        self.version = current
        return change

    def _read_deltas(self, conn: Conn, since: str, also: Sequence[deltas.Statement] = ()
                     ) -> tuple[deltas.Probe, list[deltas.Rows], list[deltas.Rows]]:
        """conn's probe (its snapshot, every table's tracking), every table's delta rows since
        ``since`` and the rows of ``also`` (:class:`DeltaRaised` when an audit row raised a
        data exception; conn's transaction is usable then):
        one pipelined round trip once the audit tables are known (:func:`deltas.read_batch`);
        else, or when their tracking changed, the probe first and one fetch per table."""
        try:
            if self._queries is not None:
                batch = deltas.read_batch(conn, self.relids, self._queries, since, also)
                if batch is not None:
                    probe, rows, extra = batch
                    self._check_tracking(conn, probe)
                    return probe, rows, extra
            with deltas.read_settings(conn):
                try:
                    probe = deltas.probe(conn, self.relids)
                except deltas.NotTracked as exc:
                    raise Invalidated(str(exc)) from exc
                infos = self._check_tracking(conn, probe)
                self._queries = self._delta_queries(conn, infos)
                rows = [deltas.fetch_query(conn, q, since) for q in self._queries]
            return probe, rows, [deltas.run(conn, st) for st in also]
        except deltas.AuditRebuilt as exc:
            self._queries = None
            raise Invalidated(str(exc)) from exc
        except psycopg.DataError as exc:
            if exc.sqlstate is None:   # a value psycopg cannot load, not PostgreSQL's error
                raise
            raise DeltaRaised(f"the delta read raised {exc.sqlstate}: "
                              f"{exc.diag.message_primary}") from exc

    def _check_tracking(self, conn: Conn, probe: deltas.Probe) -> list[deltas.TableInfo]:
        """Each table's tracking as the probe saw it; raises :class:`Invalidated` when a
        table is no longer tracked, was truncated or altered since the state was built, or
        has inheritance children or partitions now, or is a subscription's target,
        :class:`deltas.OwnWrites` when this transaction wrote to one."""
        infos = []
        for relid, epoch in zip(self.relids, self.epochs, strict=True):
            info = probe.tables.get(relid)
            if info is None:
                raise Invalidated(f"table {relid} is no longer tracked")
            if info.epoch != epoch:
                raise Invalidated(f"table {relid}: TRUNCATE or DDL since the state was built")
            if info.bypassed:  # since the state was built: such writes are not audited
                raise Invalidated(f"table {relid} is in an inheritance tree, partitioned or "
                                  "a subscription's target")
            if probe.has_xid:
                deltas.check_own_writes(conn, info)
            infos.append(info)
        return infos

    def _delta_queries(self, conn: Conn,
                       infos: Sequence[deltas.TableInfo]) -> list[deltas.DeltaQuery]:
        """One pre-aggregated query for all tables, or one row fetch per table."""
        if self._preaggregated():
            summed, self._layout = partials.query(conn, self.spec, infos)
            if not self.spec.joins:
                return [summed]
            return [summed, partials.touched_query(conn, self.spec, infos)]
        return [self._delta_query(conn, t, info)
                for t, info in zip(self.spec.tables, infos, strict=True)]

    def _delta_query(self, conn: Conn, t: TableSpec, info: deltas.TableInfo) -> deltas.DeltaQuery:
        cols = [_raw(e) for e in t.payload] + ([_raw(t.fragment)] if t.fragment else [])
        conds = [_cond(w) for w in t.where]
        if not self._unpushed(t):
            return deltas.delta_query(conn, info, t.alias, cols, conds)
        # Options.pushdown off: every audit row crosses the wire with the conjunction's value
        # (PostgreSQL's semantics), and _delta_zset drops the rows where it is not true
        return deltas.delta_query(conn, info, t.alias,
                                  [*cols, sql.SQL("({})").format(sql.SQL(" AND ").join(conds))])

    def _preaggregated(self) -> bool:
        """True when the delta is read summed per (group, fragments) (:mod:`.partials`)."""
        return partials.eligible(self.spec)

    def _step_partials(self, conn: Conn, current: str, rows: Sequence[tuple[Any, ...]],
                       touched: bool, empty: SketchDelta) -> SketchDelta:
        """``maintain`` on a delta pre-aggregated by :func:`partials.query`; ``touched``:
        some table had delta rows (:func:`partials.touched_query`)."""
        agg = self.aggregate
        assert agg is not None
        changes, values = partials.parse(self.spec, rows, self._layout)
        if not changes:
            self.applied = int(touched)
            self.version = current
            return empty
        self.applied = len(changes)
        if self.topk is None and self.spec.options.fuse_having:
            heads = self.heads

            def fused() -> SketchDelta:
                first, *rest = agg.step_sketch(changes, values, _test(self.having),
                                               [_test(h.having) for h in heads])
                for head, change in zip(heads, rest, strict=True):
                    head.merge.apply(change)
                return self.merge.apply(first)
            return self._advance(conn, current, fused)
        return self._advance(conn, current, lambda: self.merge.step(
            self._above_aggregate(agg.step_partials(changes, values))))

    # ---- heads: sketches sharing this pipeline's aggregation ----------------------------
    def shares_with(self, spec: PlanSpec) -> bool:
        """Can ``spec``'s sketch be a head of this pipeline? When both are grouped aggregates
        read pre-aggregated that differ only in their HAVING (without top-k) or only in the
        ``k`` of a top-k over groups (at most this top-k's buffer), and this pipeline has a
        consistent state."""
        if self.version is None or self.broken or self.aggregate is None \
                or not self._preaggregated():
            return False
        top = self.topk
        if top is None:
            return spec.k is None and (dataclasses.replace(spec, having=None)
                                       == dataclasses.replace(self.spec, having=None))
        return (spec.k is not None and top.buffer_limit is not None
                and spec.k <= top.buffer_limit
                and dataclasses.replace(spec, k=None) == dataclasses.replace(self.spec, k=None))

    def add_head(self, spec: PlanSpec) -> Head:
        """A new head for ``spec`` (:meth:`shares_with`), its merge built from the current
        state: the sketch of ``spec``'s query at this pipeline's version."""
        if not self.shares_with(spec):
            raise ValueError("the plan does not share this pipeline's aggregation")
        agg = self.aggregate
        assert agg is not None
        top = self.topk
        head = Head(spec, Having(spec.having) if spec.having is not None and top is None
                    else None, Merge(self.spec.slots))
        if top is None:
            head.step(agg.current_output())
        else:
            assert spec.k is not None
            top.need = max(top.need, spec.k)   # its top exact before it is listed
            if not top.complete and top.total < top.need:
                top.load(*self._refill_top_groups())
            head.merge.step(top.top(spec.k))
        self._set_heads([*self.heads, head])
        return head

    def drop_head(self, head: Head) -> None:
        self._set_heads([h for h in self.heads if h is not head])

    def _set_heads(self, heads: list[Head]) -> None:
        """A new list (a step in progress keeps its own); a top-k buffer holds at least the
        largest k read from it."""
        self.heads = heads
        if self.topk is not None:
            self.topk.need = max([self.topk.k, *(h.k or 0 for h in heads)])

    def _unpushed(self, t: TableSpec) -> bool:
        """True when ``t``'s delta fetch carries its WHERE value instead of filtering by it."""
        return not self.spec.options.pushdown and bool(t.where)

    def _delta_zset(self, t: TableSpec, rows: Sequence[tuple[Any, ...]]) -> ZSet:
        """Delta rows ``(*payload, fragment, [where value,] _mult)`` of ``t`` as a Z-set."""
        if not self._unpushed(t):
            return ZSet((tuple(r[:-1]), (), int(r[-1])) for r in rows)
        return ZSet((tuple(r[:-2]), (), int(r[-1])) for r in rows if r[-2] is True)

    def _step(self, fetched: list[ZSet]) -> ZSet:
        scanned = [scan.step(z) for scan, z in zip(self.scans, fetched, strict=True)]
        acc = scanned[0]
        for join, right in zip(self.joins, scanned[1:], strict=True):
            acc = join.step(acc, right)
        if self.aggregate is not None:
            return self._above_aggregate(self.aggregate.step(acc))
        if self.distinct is not None and self.distinct_project is not None:
            out = self.distinct.step(self.distinct_project.step(acc))
            return self.topk.step(out) if self.topk is not None else out
        if self.topk is not None:
            return self.topk.step(acc)
        return acc

    def pending(self, conn: Conn) -> int:
        """Audit rows not yet applied (eager maintenance: batch-size trigger)."""
        if self.version is None:
            return 0
        return sum(deltas.pending(conn, deltas.table_info(conn, r), self.version)
                   for r in self.relids)

    # ---- results and persistence ---------------------------------------------------------
    def held(self) -> int:
        """How large the state is: its aggregate's groups, else the rows its build read."""
        return len(self.aggregate.groups) if self.aggregate is not None else self.built_rows

    def sketch(self, head: Head | None = None) -> tuple[frozenset[int], ...]:
        """The sketch of the pipeline's query, or of ``head``'s."""
        return (self.merge if head is None else head.merge).sketch()

    def _stateful(self, head: Head | None = None) -> dict[str, Any]:
        ops: dict[str, Any] = {"merge": self.merge if head is None else head.merge}
        for name in ("aggregate", "distinct", "topk"):
            op = getattr(self, name)
            if op is not None:
                ops[name] = op
        return ops

    def snapshot(self, head: Head | None = None) -> dict[str, Json]:
        """The state of the pipeline's query, or of ``head``'s: what a pipeline compiled for
        that query restores."""
        if self.broken or self.version is None:
            raise PipelineBroken("nothing consistent to persist")
        spec = self.spec if head is None else head.spec
        with collector.paused():
            return {"format": FORMAT, "plan": spec.fingerprint(), "version": self.version,
                    "relids": list(self.relids), "epochs": list(self.epochs),
                    "ops": {k: op.snapshot() for k, op in self._stateful(head).items()},
                    "filters": [[None if f is None else f.snapshot() for f in pair]
                                for pair in self.filters]}

    def restore(self, state: dict[str, Json]) -> None:
        """Replaces the state by ``state`` (of this pipeline's own query); refused while
        heads share it, whose merges it would leave behind."""
        if self.heads:
            raise StateFormatError("a state shared by several sketches is not restored")
        if state.get("format") not in _READ_FORMATS \
                or state.get("plan") != self.spec.fingerprint():
            raise StateFormatError("persisted state belongs to another plan or format")
        ops = self._stateful()
        if set(ops) != set(state["ops"]):
            raise StateFormatError("persisted state has other operators")
        with collector.paused():
            for k, op in ops.items():
                op.restore(state["ops"][k])
        filters = state.get("filters") or [[None, None] for _ in self.spec.joins]
        if len(filters) != len(self.spec.joins):
            raise StateFormatError("persisted join filters do not match the plan")
        self.filters = [(None if a is None else KeyFilter.restore(a),
                         None if b is None else KeyFilter.restore(b)) for a, b in filters]
        self.version = str(state["version"])
        self._queries = None
        self.relids = tuple(int(r) for r in state["relids"])
        self.epochs = tuple(int(e) for e in state["epochs"])
        self.broken = False
