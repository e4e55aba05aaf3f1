"""Compiling an analysed query into a pipeline of incremental operators.

``compile(analysis, targets, params) -> Pipeline`` turns a flattened
:class:`sketches.sql.QueryAnalysis` into a :class:`PlanSpec` (plain data) and wraps it in a
:class:`~sketches.ivm.pipeline.Pipeline`:

    scan per table (delta fetch with the table's WHERE conjuncts pushed down and its fragment id
    computed in SQL) → left-deep joins on the join equalities (PostgreSQL holds the current
    inputs) → aggregate | distinct → HAVING → top-k → merge

Every per-row expression (GROUP BY keys, aggregate arguments, join keys, ORDER BY keys of a
non-aggregate top-k) is evaluated by PostgreSQL in the fetch, so it must read a single table.
HAVING and the ORDER BY of an aggregate query are evaluated in Python over the aggregate results
(:mod:`sketches.ivm.sqltext`). Whatever falls outside this raises :class:`NotMaintainable`:
the manager then recaptures instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from psycopg import sql

from sketches.ivm import thresholds
from sketches.ivm.errors import NotMaintainable
from sketches.ivm.expr import Col, Expr
from sketches.ivm.ops.aggregate import AggSpec
from sketches.ivm.ops.topk import OrderItem
from sketches.ivm.sqltext import bind_params, param_literal, parse_expression
from sketches.ranges import RangePartition
from sketches.sql.model import AggregateCall, Expression, QueryAnalysis

if TYPE_CHECKING:
    from sketches.ivm.pipeline import Pipeline
    from sketches.sketch import Sketch


@dataclass(frozen=True, slots=True)
class SketchTarget:
    """Table ``table`` (index into ``analysis.tables``) carries a sketch on ``column``."""

    table: int
    column: str
    partition: RangePartition


@dataclass(frozen=True, slots=True)
class Options:
    """``minmax_buffer``: distinct values kept per group for min/max (None: all);
    ``topk_buffer``: tuples kept by a top-k over base rows or groups (None:
    ``max(2k, k + 64)``; refilled exactly, by a query or from the aggregate's state);
    ``join_filter``: key membership filters skip partner lookups that cannot match
    (:mod:`sketches.ivm.keyfilter`; single-column join keys). Off by default: building it
    (``SELECT DISTINCT key`` per side) more than doubled build_state for a 100k ⋈ 1M join
    (1.1 s → 2.5 s), while a skipped lookup saves one indexed round trip.

    ``pushdown``: a table's WHERE conjuncts filter its delta fetch in SQL. Off, the fetch
    returns every audit row plus the conjunction's value (still PostgreSQL's semantics: NULL
    drops a row) and ``Pipeline.maintain`` drops the rows that fail it in Python — the
    unpushed plan, kept only to measure what push-down saves (``bench.ablation_bench``).
    It is left out of ``repr`` and so of the plan fingerprint: it changes how deltas travel,
    never the state, so a state persisted under one setting is valid under the other.

    ``preaggregate``: a grouped aggregate query, over one table or a join, reads its delta
    already summed per (group, fragments) in PostgreSQL — min/max as net changes per (group,
    value) — (:mod:`sketches.ivm.partials`; a join's delta is evaluated there too, by
    inclusion–exclusion over the changed tables), so Python works per touched group and
    value instead of per audit row and does no partner lookups.
    Joins keep the row path under ``join_filter`` (the filter needs the delta rows' keys).
    Like ``pushdown`` it only changes how deltas travel (left out of the fingerprint).

    ``fuse_having``: with a pre-aggregated delta and no top-k, the aggregate, HAVING and the
    merge run as one step (``Aggregate.step_sketch``) that computes no old output rows and
    only the aggregates HAVING reads. Off, the operators run one after another, as on the
    row path. Same state either way (left out of the fingerprint).

    ``minmax_counts``: without ORDER BY, a min/max that only HAVING reads, in comparisons with
    a constant such as ``max(x) >= c``, is maintained as a count of the rows with ``x >= c``
    (evaluated by PostgreSQL) instead of a buffer of values, and an aggregate HAVING does not
    read is not maintained (:mod:`sketches.ivm.thresholds`). A different state, so part of the
    fingerprint."""

    minmax_buffer: int | None = 64
    topk_buffer: int | None = None
    minmax_counts: bool = True
    join_filter: bool = False
    pushdown: bool = field(default=True, repr=False)
    preaggregate: bool = field(default=True, repr=False)
    fuse_having: bool = field(default=True, repr=False)


@dataclass(frozen=True, slots=True)
class TableSpec:
    """One table in join order: ``payload`` are the SQL expressions (over ``alias``) fetched
    per row; ``where`` its pushed-down conjuncts; ``fragment`` the SQL of its fragment id."""

    index: int
    relation: str
    alias: str
    payload: tuple[str, ...]
    where: tuple[str, ...]
    slot: int | None
    fragment: str | None
    source: str = field(default="", repr=False)
    """The table as the library's SQL names it: ``relation`` (as the query wrote it, in the
    plan's fingerprint) qualified with the schema the sketch resolved it to
    (``TableRef.resolved``), which a persisted state's fingerprint does not depend on."""


@dataclass(frozen=True, slots=True)
class JoinSpec:
    """Joining table ``tables[step + 1]`` to the tables before it: key positions in the left
    (joined-so-far) row and in the new table's payload, plus their SQL for partner lookups."""

    left_key: tuple[int, ...]
    right_key: tuple[int, ...]
    left_sql: tuple[str, ...]
    right_sql: tuple[str, ...]
    left_pos: tuple[int, ...] = ()     # join-order position of each left key column's table


@dataclass(frozen=True, slots=True)
class PlanSpec:
    tables: tuple[TableSpec, ...]
    joins: tuple[JoinSpec, ...]
    equalities: tuple[tuple[int, str, int, str], ...]   # (table pos, sql, table pos, sql)
    slots: int
    kind: str                                           # aggregate | distinct | topk | spj
    group_by: tuple[int, ...] = ()
    group_sql: tuple[str, ...] = ()
    aggs: tuple[AggSpec, ...] = ()
    agg_sql: tuple[str | None, ...] = ()
    scalar: bool = False
    having: Expr | None = None
    order_exprs: tuple[Expr, ...] = ()                  # over aggregate / distinct output
    order: tuple[OrderItem, ...] = ()                   # columns of the row entering top-k
    order_sql: tuple[str, ...] = ()                     # ORDER BY items (topk kind), in SQL
    distinct_cols: tuple[int, ...] = ()
    k: int | None = None
    options: Options = field(default_factory=Options)
    agg_origin: tuple[int | thresholds.Counter, ...] = ()
    """Where each of ``aggs`` comes from when they are not the query's own aggregates
    (``Options.minmax_counts``): the index of the query's aggregate, or the count standing in
    for a min/max; empty: ``aggs`` are the query's aggregates, in order."""

    @property
    def offsets(self) -> tuple[int, ...]:
        out, at = [], 0
        for t in self.tables:
            out.append(at)
            at += len(t.payload)
        return tuple(out)

    def fingerprint(self) -> str:
        return hashlib.sha256(repr(self).encode()).hexdigest()[:32]


_FUNCS = {"count": "count", "sum": "sum", "avg": "avg", "min": "min", "max": "max"}


class _Builder:
    def __init__(self, analysis: QueryAnalysis, targets: Sequence[SketchTarget],
                 params: Sequence[object] | None, read_as: Mapping[str, str]) -> None:
        self.a = analysis
        self.params = params
        self.read_as = read_as
        self.targets = {t.table: (slot, t) for slot, t in enumerate(targets)}
        if len(self.targets) != len(targets):
            raise NotMaintainable("two sketches on one table occurrence")
        self.order = self._join_order()
        self.pos_of_table = {t: i for i, t in enumerate(self.order)}
        self.payload: list[list[str]] = [[] for _ in self.order]
        self.frozen = False

    def bind(self, text: str) -> str:
        return bind_params(text, self.params, param_literal)

    def value(self, text: str) -> str:
        """The SQL that reads the value of ``text`` (parameters bound) into Python: its
        ``read_as`` form (see :func:`compile`), else itself."""
        bound = self.bind(text)
        return self.read_as.get(bound, bound)

    def _join_order(self) -> list[int]:
        n = len(self.a.tables)
        order = [0]
        while len(order) < n:
            nxt = next((t for t in range(n) if t not in order and any(
                {a.table, b.table} & {t} and ({a.table, b.table} - {t}) <= set(order)
                and a.table != b.table for a, b in self.a.join_equalities)), None)
            if nxt is None:
                raise NotMaintainable("tables not connected by equi-joins (cross product)")
            order.append(nxt)
        return order

    def table_of(self, expr: Expression) -> int:
        tables = {c.table for c in expr.columns}
        if len(tables) > 1:
            raise NotMaintainable(f"expression {expr.sql!r} reads several tables")
        return tables.pop() if tables else self.order[0]

    def need(self, table: int, text: str) -> int:
        """Position of ``text`` in the joined row (adding it to the table's payload)."""
        pos = self.pos_of_table[table]
        bound = self.value(text)
        if bound not in self.payload[pos]:
            assert not self.frozen, "payload registered after the first pass"
            self.payload[pos].append(bound)
        return self._offset(pos) + self.payload[pos].index(bound)

    def _offset(self, pos: int) -> int:
        return sum(len(p) for p in self.payload[:pos])

    def column_sql(self, table: int, column: str) -> str:
        return sql.Identifier(self.a.tables[table].alias, column).as_string(None)


def compile(analysis: QueryAnalysis, targets: Sequence[SketchTarget],
            params: Sequence[object] | None = None, options: Options | None = None,
            arith_types: Mapping[str, int] | None = None,
            read_as: Mapping[str, str] | None = None) -> Pipeline:
    """The pipeline maintaining the sketch of ``analysis`` (with ``params``) on ``targets``
    (slot ``i`` of every annotation is ``targets[i]``); ``arith_types``: PostgreSQL's type
    oids of the HAVING / ORDER BY arithmetic (by :attr:`~sketches.ivm.expr.Arith.sql`), whose
    range the engine then keeps as PostgreSQL does; ``read_as``: per value expression (group
    key, aggregate argument, fetched column; SQL with parameters bound) the SQL to read it
    with instead, so its Python value compares as PostgreSQL's does (a real widened to
    float8: ``sketches.incremental``). Raises :class:`NotMaintainable`."""
    from sketches.ivm.pipeline import Pipeline

    return Pipeline(plan(analysis, targets, params, options or Options(), arith_types,
                         read_as))


def compile_for_sketch(analysis: QueryAnalysis, sketch: Sketch,
                       options: Options | None = None) -> Pipeline:
    """The pipeline for a captured :class:`sketches.sketch.Sketch` (slots = ``sketch.parts``)."""
    targets = [SketchTarget(p.table.index, p.column, p.partition) for p in sketch.parts]
    return compile(analysis, targets, sketch.params, options)


def plan(analysis: QueryAnalysis, targets: Sequence[SketchTarget],
         params: Sequence[object] | None, options: Options,
         arith_types: Mapping[str, int] | None = None,
         read_as: Mapping[str, str] | None = None) -> PlanSpec:
    if not analysis.resolved:
        raise NotMaintainable("the analysis left column references unresolved")
    if not targets:
        raise NotMaintainable("no sketched table")
    b = _Builder(analysis, targets, params, read_as or {})
    # Payload order matters for positions: join keys first, in join order.
    joins_raw: list[tuple[list[tuple[int, str]], list[str]]] = []
    for step, t in enumerate(b.order[1:], start=1):
        before = set(b.order[:step])
        left, right = [], []
        for x, y in analysis.join_equalities:
            if x.table == t and y.table in before:
                x, y = y, x
            if y.table == t and x.table in before:
                left.append((x.table, b.column_sql(x.table, x.column)))
                right.append(b.column_sql(t, y.column))
        joins_raw.append((left, right))
    equalities = []
    for x, y in analysis.join_equalities:
        if x.table == y.table:
            raise NotMaintainable("an equality between columns of one table: not a join")
        equalities.append((b.pos_of_table[x.table], b.column_sql(x.table, x.column),
                           b.pos_of_table[y.table], b.column_sql(y.table, y.column)))
    where: list[list[str]] = [[] for _ in b.order]
    for w in analysis.where:
        used = {c.table for c in w.columns}
        if len(used) > 1:
            raise NotMaintainable(f"WHERE conjunct {w.sql!r} reads several tables")
        for pos in ([b.pos_of_table[used.pop()]] if used else range(len(b.order))):
            where[pos].append(b.bind(w.sql))
    def positions() -> tuple[list[tuple[int, tuple[int, ...], list[int], tuple[str, ...],
                                       tuple[str, ...], tuple[int, ...]]], str,
                             dict[str, object]]:
        pending = []
        for step, (left, right) in enumerate(joins_raw, start=1):
            t = b.order[step]
            lpos = tuple(b.need(tab, text) for tab, text in left)
            rpos = [b.need(t, text) for text in right]
            pending.append((step, lpos, rpos, tuple(b.value(x) for _, x in left),
                            tuple(b.value(x) for x in right),
                            tuple(b.pos_of_table[tab] for tab, _ in left)))
        kind, extra = _upper(analysis, b, options, arith_types or {})
        return pending, kind, extra

    positions()          # registers every payload expression
    b.frozen = True      # offsets are final now: the second pass computes the positions
    join_specs_pending, kind, extra = positions()
    offsets = [b._offset(p) for p in range(len(b.order))]
    joins = tuple(
        JoinSpec(lpos, tuple(r - offsets[step] for r in rpos), lsql, rsql, ltabs)
        for step, lpos, rpos, lsql, rsql, ltabs in join_specs_pending)
    tables: list[TableSpec] = []
    for pos, t in enumerate(b.order):
        ref = analysis.tables[t]
        relation = sql.Identifier(*([ref.schema] if ref.schema else []), ref.name).as_string(None)
        source = sql.Identifier(*([ref.qualifier] if ref.qualifier else []),
                                ref.name).as_string(None)
        slot_target = b.targets.get(t)
        frag = None
        if slot_target is not None:
            slot, target = slot_target
            frag = target.partition.fragment_sql(
                sql.Identifier(ref.alias, target.column)).as_string(None)
        tables.append(TableSpec(t, relation, ref.alias, tuple(b.payload[pos]),
                                tuple(where[pos]), slot_target[0] if slot_target else None,
                                frag, source))
    return PlanSpec(tuple(tables), joins, tuple(equalities), len(targets), kind,
                    options=options, **extra)  # type: ignore[arg-type]


def state_analysis(analysis: QueryAnalysis, spec: PlanSpec) -> QueryAnalysis:
    """``analysis`` with the aggregates ``spec`` maintains (see ``PlanSpec.agg_origin``) and
    without HAVING, ORDER BY and LIMIT: what a backend that builds aggregate state for the
    pipeline (``sketches.backends``: Spark) must compute."""
    if not spec.agg_origin:
        return analysis
    calls: list[AggregateCall] = []
    for origin in spec.agg_origin:
        if isinstance(origin, int):
            calls.append(analysis.aggregates[origin])
            continue
        arg = _counted(analysis.aggregates[origin.agg].arg, origin)
        calls.append(AggregateCall("count", arg, False, f"count({arg.sql})"))
    return dataclasses.replace(analysis, aggregates=tuple(calls), having=None, order_by=(),
                               limit=None)


def _counted(arg: Expression | None, counter: thresholds.Counter) -> Expression:
    """The argument of the count standing in for a min/max (:mod:`.thresholds`)."""
    assert arg is not None, "min/max always have an argument"
    if counter.op is None:
        return arg
    return dataclasses.replace(arg, sql=counter.condition_sql(arg.sql), column=None)


def _limit(analysis: QueryAnalysis, params: Sequence[object] | None) -> int | None:
    if analysis.limit is None or not analysis.order_by:
        return None
    k = analysis.limit.resolve(tuple(params) if params is not None else None)
    if k is None or k < 1:
        raise NotMaintainable("LIMIT without a usable value")
    return k


def _upper(analysis: QueryAnalysis, b: _Builder, options: Options,
           arith_types: Mapping[str, int]) -> tuple[str, dict[str, object]]:
    k = _limit(analysis, b.params)
    if analysis.is_aggregate:
        if analysis.distinct:
            raise NotMaintainable("DISTINCT over an aggregate")
        group_pos = tuple(b.need(b.table_of(g), g.sql) for g in analysis.group_by)
        for call in analysis.aggregates:
            if call.distinct:
                raise NotMaintainable(f"{call.sql}: DISTINCT aggregates are not maintained")
            if call.func not in _FUNCS:
                raise NotMaintainable(f"aggregate {call.func} is not maintained")
        width = len(group_pos)
        leaves: list[tuple[str, Expr]] = [(c.sql, Col(width + i))
                                          for i, c in enumerate(analysis.aggregates)]
        leaves += [(g.sql, Col(i)) for i, g in enumerate(analysis.group_by)]
        having = (parse_expression(analysis.having.sql, leaves, b.params, arith_types)
                  if analysis.having is not None else None)
        calls: list[tuple[str, Expression | None]] = [
            ("count_star" if c.arg is None else c.func, c.arg) for c in analysis.aggregates]
        origin: tuple[int | thresholds.Counter, ...] = ()
        if options.minmax_counts and k is None and having is not None:
            rw = thresholds.rewrite(having, width, [f for f, _ in calls])
            if rw is not None:
                having = rw.having
                calls = [calls[i] for i in rw.kept] + [
                    ("count", _counted(calls[c.agg][1], c)) for c in rw.counters]
                origin = (*rw.kept, *rw.counters)
        aggs: list[AggSpec] = []
        agg_sql: list[str | None] = []
        for func, arg in calls:
            if arg is None:
                aggs.append(AggSpec("count_star"))
                agg_sql.append(None)
            else:
                aggs.append(AggSpec(func, b.need(b.table_of(arg), arg.sql)))
                agg_sql.append(b.value(arg.sql))
        order_exprs: tuple[Expr, ...] = ()
        order: tuple[OrderItem, ...] = ()
        if k is not None:
            order_exprs = tuple(parse_expression(o.expr.sql, leaves, b.params, arith_types)
                                for o in analysis.order_by)
            out_width = width + len(aggs)
            order = tuple(OrderItem(out_width + i, o.descending, o.nulls_first)
                          for i, o in enumerate(analysis.order_by))
        return "aggregate", {
            "group_by": group_pos, "group_sql": tuple(b.value(g.sql) for g in analysis.group_by),
            "aggs": tuple(aggs), "agg_sql": tuple(agg_sql), "scalar": not group_pos,
            "having": having, "order_exprs": order_exprs, "order": order, "k": k,
            "agg_origin": origin}
    if analysis.distinct:
        cols = []
        for item in analysis.select:
            if item.expr is None:
                raise NotMaintainable("SELECT DISTINCT *")
            cols.append(b.need(b.table_of(item.expr), item.expr.sql))
        order = ()
        if k is not None:
            if any(o.output is None for o in analysis.order_by):
                raise NotMaintainable("ORDER BY of a DISTINCT query outside its select list")
            order = tuple(OrderItem(o.output, o.descending, o.nulls_first)
                          for o in analysis.order_by if o.output is not None)
        return "distinct", {"distinct_cols": tuple(cols), "order": order, "k": k}
    if k is not None:
        order = tuple(OrderItem(b.need(b.table_of(o.expr), o.expr.sql), o.descending,
                                o.nulls_first) for o in analysis.order_by)
        order_sql = tuple(
            b.bind(o.expr.sql) + (" DESC" if o.descending else " ASC")
            + (" NULLS FIRST" if o.nulls_first else " NULLS LAST") for o in analysis.order_by)
        return "topk", {"order": order, "order_sql": order_sql, "k": k}
    return "spj", {}
