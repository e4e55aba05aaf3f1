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
  ``+ - *``, AND/OR/NOT and IS [NOT] NULL over aggregates, group keys and numeric/boolean
  constants; anything else raises :class:`BackendUnsupported`.

A WHERE conjunct reading several tables (other than the join equalities), a per-row
expression over several tables, ``*`` outputs, DISTINCT aggregates and ``avg`` inside HAVING /
ORDER BY (PostgreSQL's numeric division scale is not reproduced) are refused.

This module uses ``sketches.sql.parse`` for parsing and printing; it walks the resulting
pglast nodes only to inline parameters and to translate HAVING / ORDER BY.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
from pglast import ast
from pglast.enums import A_Expr_Kind, BoolExprType, NullTestType
from psycopg import sql

from sketches.backends.base import BackendUnsupported, aggregate_functions
from sketches.capture import CaptureTarget
from sketches.errors import UnsupportedQuery
from sketches.sql.model import ColumnRef, Expression, QueryAnalysis
from sketches.sql.parse import parse_select, to_sql

# ---------------------------------------------------------------- expression tree (neutral)


@dataclass(frozen=True, slots=True)
class Ref:
    """A column of the backend's frame (an output of a read, a group key or an aggregate)."""

    name: str


@dataclass(frozen=True, slots=True)
class Lit:
    value: Any


@dataclass(frozen=True, slots=True)
class Bin:
    op: str  # = <> < <= > >= + - *
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class BoolOp:
    op: str  # and | or
    args: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Not:
    arg: Node


@dataclass(frozen=True, slots=True)
class IsNull:
    arg: Node
    negated: bool


Node = Ref | Lit | Bin | BoolOp | Not | IsNull

COMPARISONS = frozenset({"=", "<>", "!=", "<", "<=", ">", ">="})
ARITHMETIC = frozenset({"+", "-", "*"})


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
    if "$" not in text:
        return text
    stmt = parse_select("SELECT " + text)
    node: Any = stmt.targetList[0].val  # type: ignore[index]
    _replace_params(node, conn, params)
    return to_sql(node)


def _param_node(number: Any, conn: psycopg.Connection[Any],
                params: Sequence[object] | None) -> ast.Node:
    if params is None or not 1 <= number <= len(params):
        raise BackendUnsupported(f"parameter ${number} is not bound")
    literal = sql.Literal(params[number - 1]).as_string(conn)
    node: ast.Node = parse_select("SELECT " + literal).targetList[0].val  # type: ignore[index]
    return node


def _replace_params(node: Any, conn: psycopg.Connection[Any],
                    params: Sequence[object] | None) -> None:
    for attr in list(node):
        value = getattr(node, attr, None)
        if isinstance(value, ast.ParamRef):
            setattr(node, attr, _param_node(value.number, conn, params))
        elif isinstance(value, ast.Node):
            _replace_params(value, conn, params)
        elif isinstance(value, tuple):
            items = []
            for item in value:
                if isinstance(item, ast.ParamRef):
                    items.append(_param_node(item.number, conn, params))
                else:
                    if isinstance(item, ast.Node):
                        _replace_params(item, conn, params)
                    items.append(item)
            setattr(node, attr, tuple(items))


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
        node: Any = parse_select("SELECT " + text).targetList[0].val  # type: ignore[index]
    except UnsupportedQuery as exc:
        raise BackendUnsupported(f"cannot parse {text!r}: {exc}") from exc
    return _translate(node, names, avg, params)


_NUMERIC = (int, Decimal, float, bool)


def _translate(node: Any, names: dict[str, str], avg: frozenset[str],
               params: Sequence[object] | None) -> Node:
    printed = to_sql(node)
    if printed in avg:
        raise BackendUnsupported(f"{printed}: avg is not compared in Spark (numeric scale)")
    if printed in names:
        return Ref(names[printed])
    if isinstance(node, ast.A_Const):
        return Lit(_constant(node))
    if isinstance(node, ast.ParamRef):
        number = int(node.number or 0)
        if params is None or not 1 <= number <= len(params):
            raise BackendUnsupported(f"parameter ${number} is not bound")
        value = params[number - 1]
        if value is not None and not isinstance(value, _NUMERIC):
            raise BackendUnsupported(f"parameter ${number} of type {type(value).__name__}")
        return Lit(value)
    if isinstance(node, ast.A_Expr) and node.kind == A_Expr_Kind.AEXPR_OP \
            and len(node.name or ()) == 1:
        op = str(node.name[0].sval)  # type: ignore[index]
        right = _translate(node.rexpr, names, avg, params)
        if node.lexpr is None:
            if op == "-":
                return Bin("-", Lit(0), right)
            raise BackendUnsupported(f"prefix operator {op}")
        if op in COMPARISONS or op in ARITHMETIC:
            return Bin(op, _translate(node.lexpr, names, avg, params), right)
        raise BackendUnsupported(f"operator {op}")
    if isinstance(node, ast.BoolExpr):
        args = tuple(_translate(a, names, avg, params) for a in node.args or ())
        if node.boolop == BoolExprType.AND_EXPR:
            return BoolOp("and", args)
        if node.boolop == BoolExprType.OR_EXPR:
            return BoolOp("or", args)
        return Not(args[0])
    if isinstance(node, ast.NullTest):
        return IsNull(_translate(node.arg, names, avg, params),
                      node.nulltesttype == NullTestType.IS_NOT_NULL)
    raise BackendUnsupported(f"expression {printed!r} is not evaluated outside PostgreSQL")


def _constant(node: Any) -> object:
    if node.isnull:
        return None
    val = node.val
    if isinstance(val, ast.Integer):
        return int(val.ival or 0)
    if isinstance(val, ast.Float):
        return Decimal(str(val.fval))  # a numeric literal in PostgreSQL
    if isinstance(val, ast.Boolean):
        return bool(val.boolval)
    raise BackendUnsupported(f"constant {to_sql(node)} (only numbers and booleans)")


SUPPORTED_VALUE_TYPES = (int, Decimal, float, str, bool, dt.date, dt.datetime)
