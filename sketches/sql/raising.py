# pglast's stubs type every node attribute as Optional; the parser fills the ones read here
# for the node kinds checked first, so these checks would only add noise:
# mypy: disable-error-code="union-attr,index,arg-type,attr-defined"
"""Errors an instrumented query could skip, and values that read the clock row by row.

A sketched query must raise the error its original raises. PostgreSQL evaluates, for every
input row or group, expressions whose result a top-k or HAVING never shows:

* a top-k over rows computes its select list below its Sort, for every row passing WHERE;
* an aggregation evaluates every aggregate's argument (and transition) for every row;
* a top-k over groups computes its select list for every group, below its Sort.

The instrumented query reads only the sketch's fragments, so such an error on a skipped row
or group vanishes. The capture and the incremental maintenance evaluate, on every row and
group, only WHERE, the join and GROUP BY keys, HAVING with the aggregates it reads, and the
ORDER BY keys (a failure there recaptures, and the failing capture passes the query through).
Everything else PostgreSQL evaluates for every row or group (:func:`exposed`) must be known
not to raise (:func:`_may_raise`: a whitelist, decided with the column types) unless it is
one of those evaluated expressions.

Independently, a cast of a stored text value to a date/time type reads the clock for a
stored ``'now'``: the row means another instant in every transaction while nothing is
written, so no sketch stays exact (:func:`_clock_casts`; also arrays, ranges and domains of
such types, and any type whose catalog category is not plainly clock-free). Literals and
parameters are checked by value elsewhere (``grammar.reads_the_clock``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from itertools import combinations

from pglast import ast
from pglast.enums import A_Expr_Kind
from pglast.stream import RawStream

from sketches.lru import cached
from sketches.sql.grammar import AGGREGATES
from sketches.sql.model import AggregateCall, ColumnRef, Expression, QueryAnalysis
from sketches.sql.parse import parse_select, to_sql
from sketches.typeoids import (
    BOOL,
    BPCHAR,
    BYTEA,
    DATE,
    FLOAT4,
    FLOAT8,
    FLOATS,
    INT2,
    INT4,
    INT8,
    INTEGERS,
    INTERVAL,
    NAME,
    NUMERIC,
    TEXT,
    TEXT_LIKE,
    TIME,
    TIMESTAMP,
    TIMESTAMPTZ,
    TIMETZ,
    UNKNOWN,
    UUID,
    VARCHAR,
)


@dataclass(frozen=True, slots=True)
class Catalog:
    """What the rules read from the catalog: ``columns``, the type oid of each column of
    :func:`typed_columns`; ``categories``, the ``pg_type.typcategory`` of each type name of
    :func:`named_types` as PostgreSQL resolves it (None: unknown, missing: not asked)."""

    columns: Mapping[ColumnRef, int | None] = field(default_factory=dict)
    categories: Mapping[str, str | None] = field(default_factory=dict)
    digits: Mapping[ColumnRef, tuple[int, int]] = field(default_factory=dict)
    """Of each ``numeric(p, s)`` column of ``columns``: the most digits its values have
    before and after the point (:func:`numeric_digits`); an unconstrained numeric is not
    here."""


_TEXTS = frozenset({TEXT, VARCHAR, BPCHAR, NAME, UNKNOWN})
_CONSTANT = 0
"""Pseudo type of a bare literal: PostgreSQL gives it the type its context asks for, or
folds its cast while planning (the same error with or without a sketch)."""

_TYPE_OIDS = {
    "int2": INT2, "int4": INT4, "int8": INT8, "numeric": NUMERIC, "float4": FLOAT4,
    "float8": FLOAT8, "text": TEXT, "varchar": VARCHAR, "bpchar": BPCHAR, "name": NAME,
    "bool": BOOL, "bytea": BYTEA, "uuid": UUID, "date": DATE, "time": TIME, "timetz": TIMETZ,
    "timestamp": TIMESTAMP, "timestamptz": TIMESTAMPTZ, "interval": INTERVAL,
}
"""Built-in types by the name pglast gives them (pg_catalog comes first on the path of every
sketched session: ``lookup.relations``)."""

_CLOCK_FREE = frozenset({*INTEGERS, NUMERIC, *FLOATS, *_TEXTS, BOOL, BYTEA, UUID, INTERVAL})
"""Cast targets whose input never reads the clock ('now' is no interval). Dates, times,
their arrays, ranges, domains and unknown types may."""
_CLOCK_FREE_CATEGORIES = frozenset({"S", "N", "B", "E", "T"})
"""Type categories whose input never reads the clock: strings (citext), numbers, booleans,
enums, intervals. A domain has its base type's category; arrays ('A'), ranges ('R'),
composites ('C') and others ('U') may hold a date or time."""

_INTEGER_DIGITS = {INT2: 5, INT4: 10, INT8: 19}
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")
_BOUNDED_ARITHMETIC = frozenset({"+", "-", "*"})
_MAX_WHOLE_DIGITS = 10_000
"""Digits before the point a bounded numeric value may have (PostgreSQL fails beyond
131,072)."""
_MAX_SCALE = 10_000
"""Digits after the point a bounded numeric value may have (PostgreSQL fails beyond 16,383:
a product's scale is the sum of its factors')."""

_WIDENING = frozenset({(INT2, INT4), (INT2, INT8), (INT4, INT8), (FLOAT4, FLOAT8),
                       *((i, t) for i in INTEGERS for t in (NUMERIC, *FLOATS))})
"""Casts that cannot fail: a wider integer, numeric or a float from an integer, float8 from
float4 (no typmod)."""

_TEXT_FUNCTIONS = frozenset({
    "lower", "upper", "substr", "substring", "left", "right", "btrim", "ltrim", "rtrim",
    "trim", "replace", "md5", "split_part", "reverse", "lpad", "rpad", "initcap"})
_INTEGER_FUNCTIONS = frozenset({"length", "char_length", "character_length", "octet_length",
                                "strpos", "position"})
_TEMPORAL_FUNCTIONS = frozenset({"date_trunc", "date_part", "extract"})
_ARITHMETIC = frozenset({"+", "-", "*", "/", "%", "^"})
_COMPARISONS = frozenset({"=", "<>", "!=", "<", "<=", ">", ">="})
_COMPARING_KINDS = frozenset({A_Expr_Kind.AEXPR_OP, A_Expr_Kind.AEXPR_DISTINCT,
                              A_Expr_Kind.AEXPR_NOT_DISTINCT, A_Expr_Kind.AEXPR_NULLIF,
                              A_Expr_Kind.AEXPR_IN})


@dataclass(frozen=True, slots=True)
class Exposed:
    """What PostgreSQL evaluates for every row or group but the capture and maintenance may
    not: ``exprs`` (aggregate calls in them are values here: see ``aggregates``),
    ``aggregates`` (argument and transition per row) and ``covered``, the texts of the
    expressions the maintenance does evaluate everywhere."""

    exprs: tuple[Expression, ...]
    aggregates: tuple[AggregateCall, ...]
    covered: frozenset[str]


def refusal(analysis: QueryAnalysis, catalog: Catalog) -> str | None:
    """Why ``analysis`` must pass through by the rules of the module docstring, else None."""
    ctx = _Ctx({t.alias: t.index for t in analysis.tables}, catalog, frozenset())
    cast = next(_clock_casts(analysis, ctx), None)
    if cast is not None:
        return (f"{to_sql(cast)} casts a stored text to a type whose input may read the "
                "clock (a stored 'now' as a date or time)")
    ex = exposed(analysis)
    ctx = _Ctx(ctx.tables, catalog, ex.covered)
    for call in ex.aggregates:
        if _aggregate_may_raise(call, ctx):
            return (f"{call.sql} may raise an error on a row the sketch skips (PostgreSQL "
                    "computes every aggregate for every row)")
    for expr in ex.exprs:
        if _may_raise(_node(expr.sql), ctx):
            return (f"{expr.sql} may raise an error on a row or group the sketch skips "
                    "(PostgreSQL computes it below the sort)")
    return None


def typed_columns(analysis: QueryAnalysis) -> tuple[ColumnRef, ...]:
    """The columns whose types :func:`refusal` reads (none: it needs no catalog lookup)."""
    ex = exposed(analysis)
    exprs = [e for e in ex.exprs if e.column is None and e.sql not in ex.covered
             and not _is_aggregate(_node(e.sql))]
    exprs += [c.arg for c in ex.aggregates
              if c.arg is not None and (c.func in ("sum", "avg") or c.arg.column is None)]
    exprs += [e for e in _evaluated(analysis)
              if any(not _constant(c.arg) for c in _casts(_node(e.sql)))]
    return tuple(dict.fromkeys(c for e in exprs for c in e.columns))


def named_types(analysis: QueryAnalysis) -> tuple[str, ...]:
    """The type names (as written) of casts of stored values to types other than the
    built-ins :func:`refusal` knows, whose catalog category it reads."""
    return tuple(dict.fromkeys(
        _type_text(c.typeName) for e in _evaluated(analysis) for c in _casts(_node(e.sql))
        if not _constant(c.arg) and _target(c.typeName) is None))


def exposed(analysis: QueryAnalysis) -> Exposed:
    """The expressions and aggregates of the module docstring, by the query's shape. A
    HAVING query without LIMIT projects only the groups HAVING keeps, which the sketch
    holds; DISTINCT keys are all maintained."""
    having = () if analysis.having is None else (analysis.having,)
    keys = tuple(o.expr for o in analysis.order_by) if analysis.is_topk else ()
    covered = frozenset(e.sql for e in (*analysis.where, *analysis.group_by, *having, *keys))
    if analysis.is_aggregate:
        read = {a for e in (*having, *keys) for a in _aggregate_texts(_node(e.sql))}
        calls = tuple(a for a in analysis.aggregates if a.sql not in read)
        items = _select_exprs(analysis) if analysis.is_topk else ()
        return Exposed(items, calls, covered)
    if analysis.is_topk and not analysis.distinct:
        return Exposed(_select_exprs(analysis), (), covered)
    return Exposed((), (), covered)


def _select_exprs(analysis: QueryAnalysis) -> tuple[Expression, ...]:
    return tuple(i.expr for i in analysis.select if i.expr is not None)


def _evaluated(analysis: QueryAnalysis) -> tuple[Expression, ...]:
    """Every expression of the query (subqueries inlined)."""
    having = () if analysis.having is None else (analysis.having,)
    return (*analysis.where, *analysis.group_by, *having, *_select_exprs(analysis),
            *(o.expr for o in analysis.order_by),
            *(a.arg for a in analysis.aggregates if a.arg is not None))


@cached(4096)
def _node(sql: str) -> ast.Node:
    """The expression an analysed ``Expression.sql`` prints (a fresh parse: never mutated)."""
    node = parse_select("SELECT " + sql).targetList[0].val
    assert isinstance(node, ast.Node)
    return node


def _children(node: ast.Node | tuple[object, ...]) -> Iterator[ast.Node]:
    """Every node below ``node``, depth first."""
    values = node if isinstance(node, tuple) else tuple(getattr(node, a) for a in node)
    for value in values:
        if isinstance(value, ast.Node):
            yield value
        if isinstance(value, (ast.Node, tuple)):
            yield from _children(value)


def _casts(node: ast.Node) -> Iterator[ast.TypeCast]:
    return (n for n in (node, *_children(node)) if isinstance(n, ast.TypeCast))


def _function(node: ast.FuncCall) -> str:
    return str(node.funcname[-1].sval)


def _is_aggregate(node: ast.Node) -> bool:
    return isinstance(node, ast.FuncCall) and _function(node) in AGGREGATES


def _aggregate_texts(node: ast.Node) -> Iterator[str]:
    return (to_sql(n) for n in (node, *_children(node)) if _is_aggregate(n))


@dataclass(frozen=True, slots=True)
class _Ctx:
    tables: dict[str, int]
    catalog: Catalog
    covered: frozenset[str]

    def column(self, node: ast.ColumnRef) -> ColumnRef | None:
        alias, column = (f.sval for f in node.fields)
        table = self.tables.get(alias)
        return None if table is None else ColumnRef(table, column)

    def column_type(self, node: ast.ColumnRef) -> int | None:
        ref = self.column(node)
        return None if ref is None else self.catalog.columns.get(ref)

    def column_digits(self, node: ast.ColumnRef) -> tuple[int, int] | None:
        ref = self.column(node)
        return None if ref is None else self.catalog.digits.get(ref)

    def clock_free(self, name: ast.TypeName) -> bool:
        """Does the input of the type ``name`` never read the clock?"""
        target = _target(name)
        if target is not None:
            return target in _CLOCK_FREE
        return self.catalog.categories.get(_type_text(name)) in _CLOCK_FREE_CATEGORIES


def _type_text(name: ast.TypeName) -> str:
    """A type name as written (what ``QueryAnalysis.types`` holds, ``to_regtype`` reads)."""
    return str(RawStream()(name))


def _target(name: ast.TypeName) -> int | None:
    """The built-in type a cast names (its typmod aside), None for arrays and other types."""
    names = [n.sval for n in name.names]
    if name.arrayBounds or len(names) > 2 or len(names) == 2 and names[0] != "pg_catalog":
        return None
    return _TYPE_OIDS.get(names[-1])


def _type_of(node: ast.Node, ctx: _Ctx) -> int | None:
    """The type oid of ``node`` where it is plain to see (:data:`_CONSTANT`: a bare
    literal), else None."""
    if isinstance(node, ast.A_Const):
        return _CONSTANT
    if isinstance(node, ast.ColumnRef):
        return ctx.column_type(node)
    if isinstance(node, ast.TypeCast):
        return _target(node.typeName)
    if isinstance(node, ast.CollateClause):
        return _type_of(node.arg, ctx)
    if isinstance(node, (ast.BoolExpr, ast.NullTest, ast.BooleanTest)) or isinstance(
            node, ast.A_Expr) and node.kind in _COMPARING_KINDS and node.kind != \
            A_Expr_Kind.AEXPR_NULLIF and node.name[-1].sval in _COMPARISONS:
        return 16
    if isinstance(node, ast.FuncCall):
        return _function_type(node, ctx)
    if isinstance(node, ast.A_Expr) and _digits(node, ctx) is not None:
        return NUMERIC
    return None


def _function_type(node: ast.FuncCall, ctx: _Ctx) -> int | None:
    name = _function(node)
    if name in ("min", "max") and node.args:
        return _type_of(node.args[0], ctx)
    return INT8 if name == "count" else TEXT if name in _TEXT_FUNCTIONS else \
        INT4 if name in _INTEGER_FUNCTIONS else None


def _family(oid: int) -> str:
    return ("integer" if oid in INTEGERS else "numeric" if oid == NUMERIC
            else "float" if oid in FLOATS else "text" if oid in _TEXTS else str(oid))


def _compatible(nodes: tuple[ast.Node, ...], ctx: _Ctx) -> bool:
    """Can PostgreSQL compare (or unify, as CASE and COALESCE do) these values without a
    cast that may fail? Values of one family, integers with numeric or floats, and bare
    literals do; numeric with a float does not (numeric to float8 overflows)."""
    kinds = [_type_of(n, ctx) for n in nodes]
    if any(k is None for k in kinds):
        return False
    families = {_family(k) for k in kinds if k is not None and k != _CONSTANT}
    return all(len({a, b}) == 1 or {a, b} in ({"integer", "numeric"}, {"integer", "float"})
               for a, b in combinations(families, 2))


def _may_raise(node: ast.Node, ctx: _Ctx) -> bool:
    """Could evaluating ``node`` on some row raise an error? Whitelist: column references,
    constants, parameters, aggregate results, expressions the maintenance evaluates anyway
    (``ctx.covered``), NULL and boolean tests, AND/OR/NOT, comparisons, CASE and COALESCE of
    compatible values (:func:`_compatible`), and casts that cannot fail (:data:`_WIDENING`,
    to text or varchar)."""
    if isinstance(node, (ast.ColumnRef, ast.ParamRef, ast.A_Const)):
        return False
    if to_sql(node) in ctx.covered:
        return False
    if isinstance(node, ast.FuncCall):
        return not _is_aggregate(node)
    if isinstance(node, ast.TypeCast):
        return _cast_may_raise(node, ctx)
    if isinstance(node, (ast.NullTest, ast.BooleanTest, ast.CollateClause)):
        return _may_raise(node.arg, ctx)
    if isinstance(node, ast.BoolExpr):
        return any(_may_raise(a, ctx) for a in node.args)
    if isinstance(node, ast.CaseExpr):
        return _case_may_raise(node, ctx)
    if isinstance(node, ast.CoalesceExpr):
        return not _compatible(node.args, ctx) or any(_may_raise(a, ctx) for a in node.args)
    if isinstance(node, ast.A_Expr):
        return _digits(node, ctx) is None and _comparison_may_raise(node, ctx)
    return True


@dataclass(frozen=True, slots=True)
class _Digits:
    whole: int
    scale: int
    numeric: bool


def _digits(node: ast.Node, ctx: _Ctx) -> _Digits | None:
    """The most digits before and after the point of a row's value of ``node`` when it is
    built with ``+ - *`` from integer columns, ``numeric(p, s)`` columns and numeric
    literals, every operation a numeric one, within :data:`_MAX_WHOLE_DIGITS` and
    :data:`_MAX_SCALE`: such a value cannot raise (a sum of ``price * (1 - discount)``,
    TPC-H's revenue). None otherwise: integer arithmetic overflows, float arithmetic too,
    and an unconstrained numeric may hold 131,072 digits already."""
    if isinstance(node, ast.ColumnRef):
        integer = _INTEGER_DIGITS.get(ctx.column_type(node) or 0)
        if integer is not None:
            return _Digits(integer, 0, False)
        declared = ctx.column_digits(node)
        return None if declared is None else _Digits(*declared, True)
    if isinstance(node, ast.A_Const):
        return _literal_digits(node)
    if not (isinstance(node, ast.A_Expr) and node.kind == A_Expr_Kind.AEXPR_OP
            and len(node.name) == 1 and node.name[0].sval in _BOUNDED_ARITHMETIC):
        return None
    right = _digits(node.rexpr, ctx)
    if node.lexpr is None:   # a sign: an integer's minus overflows at its minimum
        return right if right is not None and right.numeric and node.name[0].sval != "*" \
            else None
    left = _digits(node.lexpr, ctx)
    if left is None or right is None or not (left.numeric or right.numeric):
        return None
    if node.name[0].sval == "*":
        out = _Digits(left.whole + right.whole, left.scale + right.scale, True)
    else:
        out = _Digits(max(left.whole, right.whole) + 1, max(left.scale, right.scale), True)
    return out if out.whole <= _MAX_WHOLE_DIGITS and out.scale <= _MAX_SCALE else None


def _literal_digits(node: ast.A_Const) -> _Digits | None:
    """An integer literal's digits (an integer), a decimal literal's (a numeric). As
    PostgreSQL types them (``make_const``): a literal of digits alone that fits a bigint is
    an integer (int4 or int8), though the parser hands it over as a float beyond int4's
    range. Found by a regression search: ``v * 10000000000`` was taken for numeric
    arithmetic, where it is int8 arithmetic and overflows (22003 on a row the sketch
    skipped, rows through the proxy)."""
    value = node.val
    if isinstance(value, ast.Integer):
        return _Digits(len(str(abs(value.ival))), 0, False)
    if not isinstance(value, ast.Float):
        return None
    text = value.fval.strip()
    if _INTEGER_TEXT.fullmatch(text) and -(2**63) <= int(text) < 2**63:
        return _Digits(len(text.lstrip("+-")), 0, False)
    try:
        number = Decimal(text).as_tuple()
    except InvalidOperation:
        return None
    if not isinstance(number.exponent, int):
        return None
    return _Digits(max(len(number.digits) + number.exponent, 0),
                   max(-number.exponent, 0), True)


def numeric_digits(typmod: int) -> tuple[int, int] | None:
    """The most digits before and after the point of a ``numeric(p, s)`` column's values,
    from its ``atttypmod`` (None: unconstrained). PostgreSQL 15 allows a negative scale and
    one above the precision: ``numeric(3, -2)`` holds 99,900, ``numeric(2, 4)`` 0.0099."""
    if typmod < 4:
        return None
    precision = ((typmod - 4) >> 16) & 0xFFFF
    scale = (((typmod - 4) & 0x7FF) ^ 1024) - 1024
    return max(precision - scale, 0), max(scale, 0)


def _cast_may_raise(node: ast.TypeCast, ctx: _Ctx) -> bool:
    if isinstance(node.arg, ast.A_Const):
        return False  # a literal's cast runs while parsing or planning
    if _may_raise(node.arg, ctx):
        return True
    target = _target(node.typeName)
    if target in TEXT_LIKE and not node.typeName.typmods:
        return False
    source = _type_of(node.arg, ctx)
    if node.typeName.typmods or target is None or source is None:
        return True
    return source != target and (source, target) not in _WIDENING


def _case_may_raise(node: ast.CaseExpr, ctx: _Ctx) -> bool:
    results = (*(w.result for w in node.args),
               *((node.defresult,) if node.defresult is not None else ()))
    tests = tuple(w.expr for w in node.args)
    if node.arg is not None and not all(_compatible((node.arg, t), ctx) for t in tests):
        return True
    parts = (*((node.arg,) if node.arg is not None else ()), *tests, *results)
    return not _compatible(results, ctx) or any(_may_raise(p, ctx) for p in parts)


def _comparison_may_raise(node: ast.A_Expr, ctx: _Ctx) -> bool:
    names = [n.sval for n in node.name]
    if node.kind not in _COMPARING_KINDS or (
            node.kind == A_Expr_Kind.AEXPR_OP and names[-1] not in _COMPARISONS):
        return True
    right = node.rexpr if isinstance(node.rexpr, tuple) else (node.rexpr,)
    if node.lexpr is None or not all(_compatible((node.lexpr, r), ctx) for r in right):
        return True
    return any(_may_raise(n, ctx) for n in (node.lexpr, *right))


def _aggregate_may_raise(call: AggregateCall, ctx: _Ctx) -> bool:
    """count, min and max of a value that cannot raise cannot; sum and avg only over an
    integer or numeric column or a bounded numeric value (:func:`_digits`): a float sum
    overflows, an interval sum too."""
    if call.arg is None:
        return False
    arg = _node(call.arg.sql)
    if _may_raise(arg, ctx):
        return True
    if call.func not in ("sum", "avg"):
        return False
    if isinstance(arg, ast.ColumnRef):
        return ctx.column_type(arg) not in (*INTEGERS, NUMERIC)
    digits = _digits(arg, ctx)
    return digits is None or not digits.numeric


def _clock_casts(analysis: QueryAnalysis, ctx: _Ctx) -> Iterator[ast.TypeCast]:
    """Casts of a stored value that may be text to a type whose input may read the clock."""
    for expr in _evaluated(analysis):
        for cast in _casts(_node(expr.sql)):
            if not ctx.clock_free(cast.typeName) and not _constant(cast.arg) \
                    and _may_be_text(cast.arg, ctx):
                yield cast


def _constant(node: ast.Node) -> bool:
    """A literal or parameter (their text is checked for clock words by value)."""
    if isinstance(node, ast.TypeCast):
        return _constant(node.arg)
    return isinstance(node, (ast.A_Const, ast.ParamRef))


def _may_be_text(node: ast.Node, ctx: _Ctx) -> bool:
    """Could ``node`` be a text value? Yes unless its type is plain to see and a built-in
    other than the text types: a citext or a domain over text casts by its text too."""
    if isinstance(node, ast.FuncCall) and _function(node) in _TEMPORAL_FUNCTIONS:
        return False
    if isinstance(node, ast.A_Expr) and node.kind == A_Expr_Kind.AEXPR_OP \
            and node.name[-1].sval in _ARITHMETIC:
        return False
    if isinstance(node, ast.CaseExpr):
        results = (*(w.result for w in node.args), node.defresult)
        return any(_may_be_text(r, ctx) for r in results
                   if r is not None and not isinstance(r, ast.A_Const))
    if isinstance(node, ast.CoalesceExpr):
        return any(_may_be_text(a, ctx) for a in node.args if not isinstance(a, ast.A_Const))
    kind = _type_of(node, ctx)
    return kind is None or kind in _TEXTS or kind not in _TYPE_OIDS.values()
