"""A backend-neutral batch plan of an analysed query (what a non-PostgreSQL backend executes).

The query is split so that everything whose meaning depends on PostgreSQL stays in
PostgreSQL, and only operations with identical semantics elsewhere move out:

* one **pushed-down read per base table** — ``SELECT <expressions> FROM schema.table AS alias
  WHERE <the table's own WHERE conjuncts>`` — evaluates every per-row expression (GROUP BY
  keys, aggregate arguments, ORDER BY keys, join keys), every filter and the **fragment id**
  (``coalesce(width_bucket(a, bounds::type[]), n + 1)``, exactly as capture does) inside
  PostgreSQL; bound parameters are inlined as literals printed by psycopg;
* the backend then does only equi-joins on the join equalities, grouping, count/sum/min/max,
  HAVING and ORDER BY … LIMIT (with ties) over the *values* PostgreSQL computed. HAVING and
  ORDER BY are translated into a tiny expression tree (:data:`Node`) of comparisons,
  ``+ - *``, unary minus, AND/OR/NOT and IS [NOT] NULL over aggregates, group keys and
  numeric/boolean constants; anything else raises :class:`BackendUnsupported`.

A WHERE conjunct reading several tables (other than the join equalities), a per-row
expression over several tables, ``*`` outputs, DISTINCT aggregates and ``avg`` inside HAVING /
ORDER BY (PostgreSQL's numeric division scale is not reproduced) are refused.

Parameter inlining and the HAVING / ORDER BY translation are
:mod:`sketches.sql.spark_translate` (the only package importing pglast is ``sketches.sql``);
this module turns their refusals into :class:`BackendUnsupported`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql

from sketches.backends.base import BackendUnsupported, aggregate_functions
from sketches.capture import CaptureTarget
from sketches.ivm.sqltext import param_literal
from sketches.sql import spark_translate
from sketches.sql.model import ColumnRef, Expression, QueryAnalysis
from sketches.sql.spark_translate import ARITHMETIC as ARITHMETIC
from sketches.sql.spark_translate import COMPARISONS as COMPARISONS
from sketches.sql.spark_translate import Bin as Bin
from sketches.sql.spark_translate import BoolOp as BoolOp
from sketches.sql.spark_translate import IsNull as IsNull
from sketches.sql.spark_translate import Lit as Lit
from sketches.sql.spark_translate import Neg as Neg
from sketches.sql.spark_translate import Node as Node
from sketches.sql.spark_translate import Not as Not
from sketches.sql.spark_translate import NotTranslatable
from sketches.sql.spark_translate import Ref as Ref

# ---------------------------------------------------------------- expression tree (neutral)
# The tree and its translation live in sketches.sql.spark_translate (only sketches.sql imports
# pglast); re-exported here for the backends.


@dataclass(frozen=True, slots=True)
class OrderKey:
    node: Node
    descending: bool
    nulls_first: bool


@dataclass(frozen=True, slots=True)
class AggOut:
    """Aggregate ``name`` = ``function`` over read output ``arg`` (None: count(*))."""

    name: str
    function: str
    arg: str | None


# ---------------------------------------------------------------- pushed-down reads


@dataclass(frozen=True, slots=True)
class TableRead:
    """The pushed-down PostgreSQL query of one base table."""

    index: int
    schema: str
    name: str
    alias: str
    outputs: tuple[tuple[str, str], ...]
    where: tuple[str, ...]
    slot: int | None
    target: CaptureTarget | None

    @property
    def partition_column(self) -> str | None:
        """Output carrying the raw sketch attribute (for JDBC partition predicates)."""
        return None if self.slot is None else f"p{self.slot}"

    @property
    def fragment_column(self) -> str | None:
        return None if self.slot is None else f"f{self.slot}"

    def query(self) -> sql.Composed:
        cols: list[sql.Composable] = [
            sql.SQL("{} AS {}").format(sql.SQL(text), sql.Identifier(name))
            for name, text in self.outputs]
        if self.target is not None:
            attr = sql.Identifier(self.alias, self.target.column)
            cols.append(sql.SQL("{} AS {}").format(self.target.partition.fragment_sql(attr),
                                                  sql.Identifier(str(self.fragment_column))))
            cols.append(sql.SQL("{} AS {}").format(attr,
                                                  sql.Identifier(str(self.partition_column))))
        if not cols:
            cols.append(sql.SQL("1 AS {}").format(sql.Identifier(f"one{self.index}")))
        query = sql.SQL("SELECT {} FROM {} AS {}").format(
            sql.SQL(", ").join(cols), sql.Identifier(self.schema, self.name),
            sql.Identifier(self.alias))
        if self.where:
            query = sql.SQL("{} WHERE {}").format(query, sql.SQL(" AND ").join(
                sql.SQL("({})").format(sql.SQL(w)) for w in self.where))
        return query

    def partition_predicates(self, max_parts: int) -> list[sql.Composed]:
        """WHERE predicates over the read's outputs that split it into at most ``max_parts``
        disjoint pieces covering every row: contiguous runs of the range partition's
        fragments (``p >= lo AND p < hi``), NULLs joined to the last run."""
        if self.target is None or max_parts <= 1:
            return []
        part = self.target.partition
        fragments = part.n + 1
        pieces = max(1, min(max_parts, fragments))
        col = sql.Identifier(str(self.partition_column))
        typ = sql.SQL(part.type_name)
        out: list[sql.Composed] = []
        for i in range(pieces):
            first = i * fragments // pieces
            last = (i + 1) * fragments // pieces - 1
            lo, hi = part.run_bounds(first, last)
            conds: list[sql.Composable] = []
            if lo is not None:
                conds.append(sql.SQL("{} >= {}::{}").format(col, sql.Literal(lo), typ))
            if hi is not None:
                conds.append(sql.SQL("{} < {}::{}").format(col, sql.Literal(hi), typ))
            body = sql.SQL(" AND ").join(conds) if conds else \
                sql.SQL("{} IS NOT NULL").format(col)
            if i == pieces - 1:
                body = sql.SQL("({}) OR {} IS NULL").format(body, col)
            out.append(sql.SQL("{}").format(body))
        return out


@dataclass(frozen=True, slots=True)
class BatchPlan:
    reads: tuple[TableRead, ...]
    joins: tuple[tuple[str, str], ...]
    grouped: bool
    keys: tuple[str, ...]
    aggregates: tuple[AggOut, ...]
    having: Node | None
    order: tuple[OrderKey, ...]
    limit: int | None
    slots: int

    @property
    def fragment_columns(self) -> tuple[str, ...]:
        cols = {r.slot: r.fragment_column for r in self.reads if r.slot is not None}
        return tuple(str(cols[s]) for s in range(self.slots))


# ---------------------------------------------------------------- building the plan


def _single_table(e: Expression, what: str) -> int | None:
    tables = {c.table for c in e.columns}
    if len(tables) > 1:
        raise BackendUnsupported(f"{what} {e.sql!r} reads several tables")
    return next(iter(tables), None)


class _Outputs:
    """Per-table output expressions, deduplicated by their SQL text."""

    def __init__(self, tables: int) -> None:
        self.by_table: list[list[tuple[str, str]]] = [[] for _ in range(tables)]
        self.names: dict[tuple[int, str], str] = {}
        self.count = 0

    def add(self, table: int, text: str) -> str:
        key = (table, text)
        if key not in self.names:
            name = f"e{self.count}"
            self.count += 1
            self.names[key] = name
            self.by_table[table].append((name, text))
        return self.names[key]


def inline_params(text: str, conn: psycopg.Connection[Any],
                  params: Sequence[object] | None) -> str:
    """``text`` (a PostgreSQL expression) with every ``$n`` replaced by the literal psycopg
    prints for ``params[n-1]`` — the same value, so the pushed-down query means the same."""
    try:
        return spark_translate.inline_params(
            text, lambda v: param_literal(v, conn), params)
    except NotTranslatable as exc:
        raise BackendUnsupported(str(exc)) from exc


def build_plan(conn: psycopg.Connection[Any], analysis: QueryAnalysis,
               targets: Sequence[CaptureTarget], params: Sequence[object] | None,
               schemas: Sequence[str]) -> BatchPlan:
    """The batch plan of ``analysis``; ``schemas[i]`` is table ``i``'s resolved schema."""
    if not analysis.resolved:
        raise BackendUnsupported("query columns not resolved against the catalog")
    n = len(analysis.tables)
    outs = _Outputs(n)

    def out(e: Expression, what: str) -> str:
        table = _single_table(e, what)
        return outs.add(0 if table is None else table, inline_params(e.sql, conn, params))

    def col(c: ColumnRef) -> str:
        return outs.add(c.table, sql.Identifier(analysis.tables[c.table].alias,
                                                c.column).as_string(conn))

    where: list[list[str]] = [[] for _ in range(n)]
    for w in analysis.where:
        table = _single_table(w, "WHERE condition")
        where[0 if table is None else table].append(inline_params(w.sql, conn, params))
    joins = tuple((col(a), col(b)) for a, b in analysis.join_equalities)

    grouped = analysis.is_aggregate or analysis.distinct
    key_exprs: list[Expression] = []
    if analysis.is_aggregate:
        key_exprs = list(analysis.group_by)
        if not key_exprs:
            raise BackendUnsupported("scalar aggregate")
    elif analysis.distinct:
        for item in analysis.select:
            if item.expr is None:
                raise BackendUnsupported("DISTINCT over *")
            key_exprs.append(item.expr)
    keys = tuple(out(e, "group key") for e in key_exprs)
    functions = aggregate_functions(analysis)
    aggs = tuple(
        AggOut(f"a{j}", fn, None if a.arg is None else out(a.arg, "aggregate argument"))
        for j, (fn, a) in enumerate(zip(functions, analysis.aggregates, strict=True)))

    names: dict[str, str] = {e.sql: k for e, k in zip(key_exprs, keys, strict=True)}
    for a, agg in zip(analysis.aggregates, aggs, strict=True):
        names[a.sql] = agg.name
    avg = frozenset(a.sql for a, g in zip(analysis.aggregates, aggs, strict=True)
                    if g.function == "avg")
    having = None
    if analysis.having is not None:
        having = translate(analysis.having.sql, names, avg, params)
    order: list[OrderKey] = []
    limit = None
    if analysis.limit is not None:
        limit = analysis.limit.resolve(None if params is None else tuple(params))
        if limit is None:
            raise BackendUnsupported("LIMIT parameter not bound")
        for o in analysis.order_by:
            if grouped:
                node = translate(o.expr.sql, names, avg, params)
            else:
                node = Ref(out(o.expr, "ORDER BY key"))
            order.append(OrderKey(node, o.descending, o.nulls_first))

    slot_of = {t.table.index: i for i, t in enumerate(targets)}
    reads = tuple(
        TableRead(i, schemas[i], t.name, t.alias, tuple(outs.by_table[i]), tuple(where[i]),
                  slot_of.get(i), targets[slot_of[i]] if i in slot_of else None)
        for i, t in enumerate(analysis.tables))
    return BatchPlan(reads, joins, grouped, keys, aggs, having, tuple(order), limit,
                     len(targets))


# ---------------------------------------------------------------- HAVING / ORDER BY


def translate(text: str, names: dict[str, str], avg: frozenset[str],
              params: Sequence[object] | None) -> Node:
    """``text`` (HAVING or an ORDER BY key of an aggregate query) as a :data:`Node` over the
    aggregate / group key columns named in ``names`` (keyed by their SQL text)."""
    try:
        return spark_translate.translate(text, names, avg, params)
    except NotTranslatable as exc:
        raise BackendUnsupported(str(exc)) from exc


SUPPORTED_VALUE_TYPES = (int, Decimal, float, str, bool, dt.date, dt.datetime)
