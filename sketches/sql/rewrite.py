# pglast's stubs type every node attribute as Optional; the parser fills the ones read here
# for the node kinds checked first, so these checks would only add noise:
# mypy: disable-error-code="union-attr,index,arg-type,operator,misc,attr-defined,return-value"
"""AST rewrites: the skipping predicate (sketch use) and the capture query.

Both start from a fresh parse of the client's SQL, so the client's text (parameters ``$n``
included) is preserved everywhere except where a node is added.
"""

from __future__ import annotations

import copy
import functools
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from pglast import ast
from pglast.enums import A_Expr_Kind, BoolExprType, LimitOption, NullTestType

from sketches.errors import InstrumentationError, UnsupportedQuery
from sketches.lru import cached
from sketches.sql.model import QueryAnalysis
from sketches.sql.parse import parse_select, print_checked, same_tree, scopes, to_sql

FRAGMENT_COLUMN = "__imp_f"
CAPTURE_CTE = "__imp_r"


@dataclass(frozen=True, slots=True)
class Range:
    """``lo <= a < hi`` with PostgreSQL literals; ``None`` is an open end."""

    lo: str | None
    hi: str | None


@dataclass(frozen=True, slots=True)
class SkipFilter:
    """Keep only rows of the table ``alias`` (in SELECT ``scope``) whose ``column`` lies in one
    of ``ranges`` or, if ``include_null``, is NULL."""

    scope: int
    alias: str
    column: str
    type_name: str
    ranges: tuple[Range, ...]
    include_null: bool


@dataclass(frozen=True, slots=True)
class FragmentTarget:
    """Compute the fragment id of ``alias.column`` (in SELECT ``scope``) against the bounds
    ``array_literal::type_name[]``; NULL → ``null_fragment``. ``grouped`` says the column is a
    GROUP BY column of the top-level SELECT (else, in an aggregate query, it is wrapped in
    ``min()`` — it is constant per group because it is ≡ a group-by column)."""

    scope: int
    alias: str
    column: str
    type_name: str
    array_literal: str
    null_fragment: int
    grouped: bool


@functools.lru_cache(maxsize=256)
def _type_name(type_name: str, array: bool) -> ast.TypeName:
    # The type name comes from format_type() in the catalog, never from a client.
    cast = parse_select("SELECT NULL::" + type_name + ("[]" if array else ""))
    node = cast.targetList[0].val
    if not isinstance(node, ast.TypeCast):
        raise InstrumentationError(f"cannot build type {type_name}")
    return node.typeName


def _column(alias: str, column: str) -> ast.ColumnRef:
    return ast.ColumnRef(fields=(ast.String(sval=alias), ast.String(sval=column)))


def _literal(text: str, type_name: str) -> ast.TypeCast:
    return ast.TypeCast(arg=ast.A_Const(isnull=False, val=ast.String(sval=text)),
                        typeName=copy.deepcopy(_type_name(type_name, False)))


def _compare(op: str, left: ast.Node, right: ast.Node) -> ast.A_Expr:
    return ast.A_Expr(kind=A_Expr_Kind.AEXPR_OP, name=(ast.String(sval=op),), lexpr=left,
                      rexpr=right)


def _bool(op: BoolExprType, args: Sequence[ast.Node]) -> ast.Node:
    return args[0] if len(args) == 1 else ast.BoolExpr(boolop=op, args=tuple(args))


_INTEGER_TYPES = frozenset({"smallint", "integer", "bigint"})
_MAX_ENUMERATED = 4
"""A range of an integer column spanning at most this many values is listed instead."""


def _integer_values(r: Range, type_name: str) -> range | None:
    """The values of ``r`` when the column is an integer type and ``r`` is a short closed
    range: for integers ``lo <= a < hi`` is exactly ``a = lo OR … OR a = hi - 1``."""
    if type_name not in _INTEGER_TYPES or r.lo is None or r.hi is None:
        return None
    try:
        lo, hi = int(r.lo), int(r.hi)
    except ValueError:
        return None
    return range(lo, hi) if 0 < hi - lo <= _MAX_ENUMERATED else None


def _range_test(f: SkipFilter, r: Range) -> ast.Node:
    parts: list[ast.Node] = []
    if r.lo is not None:
        parts.append(_compare(">=", _column(f.alias, f.column), _literal(r.lo, f.type_name)))
    if r.hi is not None:
        parts.append(_compare("<", _column(f.alias, f.column), _literal(r.hi, f.type_name)))
    if not parts:
        parts.append(ast.NullTest(arg=_column(f.alias, f.column),
                                  nulltesttype=NullTestType.IS_NOT_NULL, argisrow=False))
    return _bool(BoolExprType.AND_EXPR, parts)


def _any_of(f: SkipFilter, values: Sequence[int]) -> ast.A_Expr:
    """``a = ANY('{v,…}'::type[])``: one node instead of a disjunct per value. Why: a sketch
    of scattered groups has many one-value runs, and every AST node costs printing, re-parse
    and planning time (50 runs as ranges took ~25 ms to instrument); btree indexes serve
    ``= ANY`` as they serve the ranges."""
    array = ast.TypeCast(arg=ast.A_Const(isnull=False, val=ast.String(
        sval="{" + ",".join(str(v) for v in values) + "}")),
        typeName=copy.deepcopy(_type_name(f.type_name, True)))
    return ast.A_Expr(kind=A_Expr_Kind.AEXPR_OP_ANY, name=(ast.String(sval="="),),
                      lexpr=_column(f.alias, f.column), rexpr=array)


def skip_predicate(f: SkipFilter) -> ast.Node:
    """``(a >= lo AND a < hi) OR … OR a IS NULL`` (``FALSE`` for an empty sketch); short
    ranges of an integer column are listed in one ``a = ANY(…)`` instead."""
    disjuncts: list[ast.Node] = []
    listed: list[int] = []
    for r in f.ranges:
        values = _integer_values(r, f.type_name)
        if values is not None:
            listed.extend(values)
        else:
            disjuncts.append(_range_test(f, r))
    if listed:
        disjuncts.insert(0, _any_of(f, listed))
    if f.include_null:
        disjuncts.append(ast.NullTest(arg=_column(f.alias, f.column),
                                      nulltesttype=NullTestType.IS_NULL, argisrow=False))
    if not disjuncts:
        return ast.A_Const(isnull=False, val=ast.Boolean(boolval=False))
    return _bool(BoolExprType.OR_EXPR, disjuncts)


def _conjuncts(node: ast.Node) -> tuple[ast.Node, ...]:
    if isinstance(node, ast.BoolExpr) and node.boolop == BoolExprType.AND_EXPR:
        return tuple(node.args)
    return (node,)


def _and_into_where(select: ast.SelectStmt, predicates: Sequence[ast.Node]) -> None:
    """``WHERE old AND p1 AND …`` as one flat AND (PostgreSQL's parser flattens ``(a AND b)
    AND c`` too, so the re-parse check sees the same tree); a lone predicate without a WHERE
    becomes the WHERE."""
    old = select.whereClause
    if old is None and len(predicates) == 1:
        select.whereClause = predicates[0]
        return
    args = [] if old is None else list(_conjuncts(old))
    for p in predicates:
        args += _conjuncts(p)
    select.whereClause = ast.BoolExpr(boolop=BoolExprType.AND_EXPR, args=tuple(args))


Schemas = tuple[tuple[int, str, str], ...]
"""``(scope, alias, schema)`` of tables whose name the rewritten text qualifies with
``schema``: it then names the relation its caller resolved (and locked), whatever the
search_path finds when the text is parsed. Found by a helper's search: a same-named table
created earlier on the search_path between the wrapping's snapshot and the instrumented
query's parse was read in the older snapshot, and the query answered no rows."""


def _qualify(selects: Sequence[ast.SelectStmt], schemas: Schemas) -> None:
    """Sets the schema of each table of :data:`Schemas` written without one (in place)."""
    wanted = {(scope, alias): schema for scope, alias, schema in schemas}

    def tables(item: ast.Node) -> Iterator[ast.RangeVar]:
        if isinstance(item, ast.JoinExpr):
            yield from tables(item.larg)
            yield from tables(item.rarg)
        elif isinstance(item, ast.RangeVar):
            yield item

    for scope, select in enumerate(selects):
        for item in select.fromClause or ():
            for table in tables(item):
                alias = table.alias.aliasname if table.alias is not None else table.relname
                schema = wanted.get((scope, alias))
                if schema is not None and not table.schemaname:
                    table.schemaname = schema


def _and_filters(sql: str, filters: Sequence[ast.Node], scope_ids: Sequence[int],
                 schemas: Schemas = ()) -> tuple[ast.SelectStmt, list[bool]]:
    """``sql`` parsed with ``filters[i]`` AND-ed into the WHERE of SELECT ``scope_ids[i]`` and
    its tables qualified (:data:`Schemas`); and per filter whether it became that WHERE on
    its own (not an operand of AND)."""
    stmt = parse_select(sql)
    selects = scopes(stmt)
    _qualify(selects, schemas)
    by_scope: dict[int, list[ast.Node]] = {}
    for node, scope in zip(filters, scope_ids, strict=True):
        if not 0 <= scope < len(selects):
            raise InstrumentationError(f"scope {scope} not found in the query")
        by_scope.setdefault(scope, []).append(node)
    for scope, nodes in by_scope.items():
        _and_into_where(selects[scope], nodes)
    return stmt, [selects[s].whereClause is n for n, s in zip(filters, scope_ids, strict=True)]


def print_skip_filters(sql: str, filters: Sequence[SkipFilter], schemas: Schemas = ()) -> str:
    """``sql`` with each filter's predicate AND-ed into the WHERE of the SELECT that lists the
    table and its tables qualified (:data:`Schemas`); the whole statement printed and checked
    by the re-parse safety belt. The reference for :func:`add_skip_filters`."""
    stmt, _alone = _and_filters(sql, [skip_predicate(f) for f in filters],
                                [f.scope for f in filters], schemas)
    return print_checked(stmt)


@dataclass(frozen=True, slots=True)
class _Skeleton:
    """A statement printed with one placeholder per filter: ``pieces`` are the texts around
    the placeholders, ``order[j]`` the filter whose placeholder follows ``pieces[j]`` (the
    text order, not the filters' order: an outer SELECT prints after its FROM subqueries);
    ``alone[i]``: filter i is the whole WHERE of its SELECT."""

    pieces: tuple[str, ...]
    order: tuple[int, ...]
    alone: tuple[bool, ...]


@cached(512)
def _skeleton(sql: str, scope_ids: tuple[int, ...], schemas: Schemas = ()) -> _Skeleton:
    """``sql`` printed (and checked) with a placeholder column where each filter goes. A
    placeholder is a lower-case identifier with a random part, printed as it is; it must occur
    exactly once in the text."""
    nonce = secrets.token_hex(8)
    names = [f"imp_skip_{nonce}_{i}_" for i in range(len(scope_ids))]
    stmt, alone = _and_filters(sql, [ast.ColumnRef(fields=(ast.String(sval=n),)) for n in names],
                               scope_ids, schemas)
    text = print_checked(stmt)
    if any(text.count(name) != 1 for name in names):
        raise InstrumentationError("a placeholder is not printed exactly once")
    order = sorted(range(len(names)), key=lambda i: text.index(names[i]))
    pieces, at = [], 0
    for i in order:
        start = text.index(names[i])
        pieces.append(text[at:start])
        at = start + len(names[i])
    return _Skeleton((*pieces, text[at:]), tuple(order), tuple(alone))


@cached(2048)
def _predicate_text(f: SkipFilter) -> tuple[str, bool]:
    """The printed predicate of ``f`` (checked: it re-parses to the same tree) and whether it
    is an OR (which needs parentheses as an operand of AND; an AND's operands join the list)."""
    node = skip_predicate(f)
    text = to_sql(node)
    try:
        again = parse_select("SELECT " + text).targetList
    except UnsupportedQuery as exc:
        raise InstrumentationError(f"skip predicate does not parse: {exc}") from exc
    if len(again) != 1 or not same_tree(again[0].val, node):
        raise InstrumentationError("skip predicate re-parses to a different tree")
    return text, isinstance(node, ast.BoolExpr) and node.boolop == BoolExprType.OR_EXPR


def add_skip_filters(sql: str, filters: Sequence[SkipFilter], schemas: Schemas = ()) -> str:
    """:func:`print_skip_filters`, assembled from the statement printed once per query text
    with placeholders (:func:`_skeleton`) and each predicate printed on its own, parenthesised
    as the printer does it for an operand of AND (an OR; an AND joins the list). The text is
    the same (the tests compare the two on generated filters).

    Why: a maintained sketch changes its fragments with every delta, so the whole statement
    was printed and re-parsed again for every change (1.5-3 ms each, a tenth of a top-k
    maintenance); a predicate alone costs a fraction of that."""
    skeleton = _skeleton(sql, tuple(f.scope for f in filters), schemas)
    out = [skeleton.pieces[0]]
    for i, piece in zip(skeleton.order, skeleton.pieces[1:], strict=True):
        text, disjunction = _predicate_text(filters[i])
        out += [f"({text})" if disjunction and not skeleton.alone[i] else text, piece]
    return "".join(out)


def fragment_expression(t: FragmentTarget, column: ast.Node | None = None) -> ast.Node:
    """``coalesce(width_bucket(alias.column, 'bounds'::type[]), null_fragment)``."""
    bounds = ast.TypeCast(arg=ast.A_Const(isnull=False, val=ast.String(sval=t.array_literal)),
                          typeName=copy.deepcopy(_type_name(t.type_name, True)))
    call = ast.FuncCall(funcname=(ast.String(sval="width_bucket"),),
                        args=(column or _column(t.alias, t.column), bounds))
    return ast.CoalesceExpr(args=(call, ast.A_Const(isnull=False,
                                                    val=ast.Integer(ival=t.null_fragment))))


def _target(name: str, value: ast.Node) -> ast.ResTarget:
    return ast.ResTarget(name=name, val=value)


def capture_statement(sql: str, analysis: QueryAnalysis,
                      targets: Sequence[FragmentTarget]) -> str:
    """The pushed-down capture query: one row ``(pg_current_snapshot()::text, int[] per
    target)`` — the sorted fragment ids of the rows that contribute to the query's result.

    The client's query is kept as it is (so ORDER BY aliases, positions and ``$n`` still work)
    with one extra output per target (its fragment id, computed in the SELECT that lists the
    table and passed up through FROM subqueries); ``LIMIT k`` becomes ``FETCH FIRST k ROWS
    WITH TIES`` so every row tied with the k-th one counts (see ``sketches.safety``). The
    outer query aggregates the ids of the materialised result inside PostgreSQL. A table
    written without a schema is qualified with the one ``analysis`` resolved it to, if any
    (``QueryAnalysis.with_schemas``).
    """
    stmt = parse_select(sql)
    selects = scopes(stmt)
    _qualify(selects, tuple((t.scope, t.alias, t.resolved) for t in analysis.tables
                            if t.resolved is not None))
    for i, t in enumerate(targets):
        name = f"{FRAGMENT_COLUMN}{i}"
        scope = t.scope
        node: ast.Node = fragment_expression(t)
        while scope != 0:
            select = selects[scope]
            select.targetList = (*select.targetList, _target(name, node))
            parent = analysis.scopes[scope]
            assert parent.parent is not None and parent.alias is not None
            node = _column(parent.alias, name)
            scope = parent.parent
        if analysis.is_aggregate and not (t.scope == 0 and t.grouped):
            node = ast.FuncCall(funcname=(ast.String(sval="min"),), args=(node,))
        stmt.targetList = (*stmt.targetList, _target(name, node))
    if stmt.limitCount is not None:
        if not stmt.sortClause:
            raise InstrumentationError("LIMIT without ORDER BY cannot be captured")
        stmt.limitOption = LimitOption.LIMIT_OPTION_WITH_TIES
    outer = parse_select(_outer_template(len(targets)))
    outer.withClause.ctes[0].ctequery = stmt
    return print_checked(outer)


def _outer_template(count: int) -> str:
    # Only this module's own identifiers go into the text; no client value does.
    parts = ["SELECT pg_catalog.pg_current_snapshot()::text"]
    for i in range(count):
        col = f"{FRAGMENT_COLUMN}{i}"
        parts.append(f", (SELECT coalesce(array_agg(DISTINCT {col} ORDER BY {col}),"
                     f" '{{}}'::int[]) FROM {CAPTURE_CTE})")
    return f"WITH {CAPTURE_CTE} AS MATERIALIZED (SELECT 1) " + "".join(parts)


def expression_sql(node: ast.Node) -> str:
    """Printed form of an expression node (re-exported for callers outside sketches.sql)."""
    return to_sql(node)
