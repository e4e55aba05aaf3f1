# pglast's stubs type every node attribute as Optional; the parser fills the ones read here
# for the node kinds checked first, so these checks would only add noise:
# mypy: disable-error-code="union-attr,index,arg-type,operator,misc,attr-defined,return-value"
"""Analysis of the supported query class into a flattened ``QueryAnalysis``.

Supported: one SELECT over base tables combined with inner joins (``JOIN … ON``, ``CROSS
JOIN``, comma joins) and plain SPJ subqueries in FROM; WHERE/ON conditions built from
AND/OR/NOT, comparisons, BETWEEN, IN, LIKE/ILIKE, IS [NOT] NULL, casts, CASE/COALESCE and a
list of immutable functions; GROUP BY expressions; aggregates count/sum/avg/min/max (optionally
DISTINCT) over expressions; HAVING; ORDER BY; LIMIT k (constant or ``$n``); DISTINCT.
Everything else raises ``UnsupportedQuery(reason)``.

Column resolution: qualified references resolve syntactically. An unqualified column in a
scope with several FROM items needs the catalog: pass a ``resolver`` (``(schema, table) ->
column names``); without one such queries raise ``NeedsCatalog`` (a subclass of
UnsupportedQuery that means "retry with a resolver", used by the cheap ``classify``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pglast import ast
from pglast.enums import (
    A_Expr_Kind,
    BoolExprType,
    JoinType,
    LimitOption,
    SetOperation,
    SortByDir,
    SortByNulls,
)
from pglast.stream import RawStream

from sketches.errors import NeedsCatalog, UnsupportedQuery
from sketches.sql.grammar import (
    AGGREGATES,
    CATALOG_NAME_TYPES,
    EXPR_KINDS,
    FUNCTIONS,
    LEAF_NODES,
    PLAIN_NODES,
    implicit_name,
    reads_the_clock,
)
from sketches.sql.model import (
    AggregateCall,
    ColumnRef,
    Expression,
    Limit,
    OrderItem,
    QueryAnalysis,
    Scope,
    SelectItem,
    TableRef,
)
from sketches.sql.parse import parse_select, to_sql

_BETWEEN_KINDS = frozenset({
    A_Expr_Kind.AEXPR_BETWEEN, A_Expr_Kind.AEXPR_NOT_BETWEEN, A_Expr_Kind.AEXPR_BETWEEN_SYM,
    A_Expr_Kind.AEXPR_NOT_BETWEEN_SYM,
})
_TEXT_SEARCH_OPERATORS = frozenset({"@@", "@@@"})
"""``text @@ text`` parses both sides under the session's default_text_search_config (which
PostgreSQL does not report), and a query of stop words only raises a NOTICE for every row
read: an instrumented query reads fewer rows (found: a sketch captured under english served
a session on simple, 0 groups instead of 5)."""
_SHIFTS = frozenset({"<<", ">>"})
"""Bit shifts: the one integer operation whose value (not only whether it overflows) depends
on the operand's width — ``1::int2 << 20`` is 0, ``1::int4 << 20`` is 1048576. The library
binds an int parameter as psycopg does, as the narrowest integer type that holds it, and a
client may have declared a wider one (JDBC's ``setInt``): found, ``($1 << g) > 100`` with an
integer 1 answered 8 rows of 23 through the proxy."""


def _has_param(node: object) -> bool:
    """Does the expression tree ``node`` hold a ``$n``?"""
    if isinstance(node, ast.ParamRef):
        return True
    if isinstance(node, tuple):
        return any(_has_param(n) for n in node)
    if isinstance(node, ast.Node):
        return any(_has_param(getattr(node, attr)) for attr in node)
    return False


ColumnResolver = Callable[[str | None, str], Sequence[str] | None]
"""``(schema as written or None, table) -> its column names``, or None if no such table."""

@dataclass
class _Entry:
    """A FROM item visible in a scope: a base table or an inlined subquery."""

    alias: str
    table: int | None = None
    outputs: dict[str, tuple[ast.Node, tuple[ColumnRef, ...]]] | None = None


@dataclass
class _Ctx:
    """What an expression walk may see and what it collected."""

    entries: list[_Entry]
    allow_aggregates: bool = False
    in_aggregate: bool = False
    columns: list[ColumnRef] = field(default_factory=list)
    has_aggregate: bool = False


def analyse(sql: str, resolver: ColumnResolver | None = None,
            lenient: bool = False) -> QueryAnalysis:
    """Analyses ``sql``; raises UnsupportedQuery (``"unsupported: <reason>"``) outside the
    supported class and NeedsCatalog when column resolution needs ``resolver``.

    ``lenient``: instead of NeedsCatalog, guess the table of an unresolvable column (the
    result has ``resolved=False``): every syntactic check still runs, which is what a cheap
    classification needs; such an analysis must not be used to rewrite anything."""
    return _Analyser(sql, resolver, lenient).run()


class _Analyser:
    def __init__(self, sql: str, resolver: ColumnResolver | None, lenient: bool) -> None:
        self.sql = sql
        self.resolver = resolver
        self.lenient = lenient
        self.tables: list[TableRef] = []
        self.scopes: list[Scope] = []
        self.names: set[str] = set()
        self.equalities: list[tuple[ColumnRef, ColumnRef]] = []
        self.where: list[Expression] = []
        self.aggregates: dict[str, AggregateCall] = {}
        self.params: set[int] = set()
        self.routines: set[str] = set()
        self.operators: set[str] = set()
        self.types: set[str] = set()
        self.collations: set[str] = set()
        self.calls: set[str] = set()
        self.column_cache: dict[int, frozenset[str] | None] = {}
        self.resolved = True

    # ---- statement level -------------------------------------------------------------

    def run(self) -> QueryAnalysis:
        stmt = parse_select(self.sql)
        self._check_select(stmt)
        entries, conds = self._from(stmt, None, None)
        for cond in conds:
            self._condition(cond, entries)
        self._condition(stmt.whereClause, entries)
        select, outputs = self._select_list(stmt, entries)
        group_by = tuple(self._group_item(g, entries, outputs) for g in stmt.groupClause or ())
        having = None
        if stmt.havingClause is not None:
            having = self._expression(stmt.havingClause, _Ctx(entries, allow_aggregates=True))
        order_by = tuple(self._order_item(s, entries, outputs) for s in stmt.sortClause or ())
        return QueryAnalysis(
            sql=self.sql, tables=tuple(self.tables), scopes=tuple(self.scopes),
            join_equalities=tuple(self.equalities), where=tuple(self.where),
            group_by=group_by, aggregates=tuple(self.aggregates.values()), having=having,
            order_by=order_by, limit=self._limit(stmt), distinct=bool(stmt.distinctClause),
            select=select, params=tuple(sorted(self.params)), resolved=self.resolved,
            routines=frozenset(self.routines), operators=frozenset(self.operators),
            types=frozenset(self.types), calls=frozenset(self.calls),
            collations=frozenset(self.collations))

    def _check_select(self, stmt: ast.SelectStmt, subquery: bool = False) -> None:
        checks = [
            (stmt.withClause is not None, "WITH (common table expressions)"),
            (stmt.op != SetOperation.SETOP_NONE, "set operation (UNION/INTERSECT/EXCEPT)"),
            (bool(stmt.valuesLists), "VALUES"),
            (stmt.intoClause is not None, "SELECT INTO"),
            (bool(stmt.lockingClause), "FOR UPDATE/SHARE"),
            (bool(stmt.windowClause), "window clause"),
            (bool(stmt.groupDistinct), "GROUP BY DISTINCT"),
            (stmt.limitOffset is not None, "OFFSET"),
            (stmt.limitOption == LimitOption.LIMIT_OPTION_WITH_TIES, "FETCH … WITH TIES"),
            (not stmt.fromClause, "no FROM clause"),
            (bool(stmt.distinctClause) and stmt.distinctClause != (None,), "DISTINCT ON"),
        ]
        if subquery:
            checks += [
                (bool(stmt.groupClause) or stmt.havingClause is not None,
                 "aggregation in a FROM subquery"),
                (bool(stmt.distinctClause), "DISTINCT in a FROM subquery"),
                (stmt.limitCount is not None, "LIMIT in a FROM subquery"),
                (bool(stmt.sortClause), "ORDER BY in a FROM subquery"),
            ]
        for failed, reason in checks:
            if failed:
                raise UnsupportedQuery(reason)
        for g in stmt.groupClause or ():
            if isinstance(g, ast.GroupingSet):
                raise UnsupportedQuery("GROUPING SETS/ROLLUP/CUBE")

    def _limit(self, stmt: ast.SelectStmt) -> Limit | None:
        node = stmt.limitCount
        if node is None:
            return None
        if isinstance(node, ast.A_Const) and isinstance(node.val, ast.Integer):
            if node.val.ival < 0:
                raise UnsupportedQuery("negative LIMIT")
            return Limit(node.val.ival, None)
        if isinstance(node, ast.ParamRef):
            self.params.add(node.number)
            return Limit(None, node.number)
        raise UnsupportedQuery("LIMIT that is not an integer constant or parameter")

    # ---- FROM ------------------------------------------------------------------------

    def _from(self, select: ast.SelectStmt, parent: int | None,
              alias: str | None) -> tuple[list[_Entry], list[ast.Node]]:
        scope = len(self.scopes)
        self.scopes.append(Scope(scope, parent, alias))
        entries: list[_Entry] = []
        conds: list[ast.Node] = []
        for item in select.fromClause or ():
            self._from_item(item, scope, entries, conds)
        return entries, conds

    def _claim(self, name: str) -> None:
        if name in self.names:
            raise UnsupportedQuery(f"table name or alias {name!r} used twice in the query")
        self.names.add(name)

    def _from_item(self, item: ast.Node, scope: int, entries: list[_Entry],
                   conds: list[ast.Node]) -> None:
        if isinstance(item, ast.RangeVar):
            if item.catalogname:
                raise UnsupportedQuery("catalog-qualified table name")
            if item.alias is not None and item.alias.colnames:
                raise UnsupportedQuery("column aliases on a table")
            name = item.alias.aliasname if item.alias is not None else item.relname
            self._claim(name)
            ref = TableRef(len(self.tables), item.schemaname, item.relname, name, scope)
            self.tables.append(ref)
            entries.append(_Entry(name, table=ref.index))
        elif isinstance(item, ast.JoinExpr):
            if item.jointype != JoinType.JOIN_INNER:
                raise UnsupportedQuery("outer join")
            if item.isNatural or item.usingClause:
                raise UnsupportedQuery("NATURAL JOIN / JOIN USING")
            if item.alias is not None or item.join_using_alias is not None:
                raise UnsupportedQuery("alias on a join")
            self._from_item(item.larg, scope, entries, conds)
            self._from_item(item.rarg, scope, entries, conds)
            if item.quals is not None:
                conds.append(item.quals)
        elif isinstance(item, ast.RangeSubselect):
            entries.append(self._subquery(item, scope))
        else:
            raise UnsupportedQuery(f"FROM item {type(item).__name__}")

    def _subquery(self, item: ast.RangeSubselect, scope: int) -> _Entry:
        if item.lateral:
            raise UnsupportedQuery("LATERAL subquery")
        sub = item.subquery
        if not isinstance(sub, ast.SelectStmt) or item.alias is None:
            raise UnsupportedQuery("FROM subquery without alias")
        alias = item.alias.aliasname
        self._claim(alias)
        self._check_select(sub, subquery=True)
        inner, conds = self._from(sub, scope, alias)
        for cond in conds:
            self._condition(cond, inner)
        self._condition(sub.whereClause, inner)
        outputs: dict[str, tuple[ast.Node, tuple[ColumnRef, ...]]] = {}
        names = [c.sval for c in item.alias.colnames or ()]
        for pos, res in enumerate(sub.targetList or ()):
            if isinstance(res.val, ast.ColumnRef) and isinstance(res.val.fields[-1], ast.A_Star):
                raise UnsupportedQuery("* in a FROM subquery")
            ctx = _Ctx(inner)
            node = self._walk_node(res.val, ctx)
            name = names[pos] if pos < len(names) else (res.name or implicit_name(res.val))
            if name is None:
                raise UnsupportedQuery("unnamed expression in a FROM subquery")
            if name in outputs:
                raise UnsupportedQuery(f"duplicate output {name!r} in a FROM subquery")
            outputs[name] = (node, tuple(dict.fromkeys(ctx.columns)))
        return _Entry(alias, outputs=outputs)

    # ---- conditions, select list, GROUP BY, ORDER BY -----------------------------------

    def _condition(self, node: ast.Node | None, entries: list[_Entry]) -> None:
        """Splits a condition into conjuncts: column = column across tables becomes a join
        equality, the rest WHERE conjuncts."""
        if node is None:
            return
        if isinstance(node, ast.BoolExpr) and node.boolop == BoolExprType.AND_EXPR:
            for arg in node.args:
                self._condition(arg, entries)
            return
        ctx = _Ctx(entries)
        inlined = self._walk_node(node, ctx)
        pair = _column_equality(inlined, self)
        if pair is not None:
            self.equalities.append(pair)
        else:
            self.where.append(self._finish(inlined, ctx))

    def _select_list(self, stmt: ast.SelectStmt, entries: list[_Entry]
                     ) -> tuple[tuple[SelectItem, ...], list[tuple[str | None, Expression]]]:
        items: list[SelectItem] = []
        outputs: list[tuple[str | None, Expression]] = []
        for res in stmt.targetList or ():
            val = res.val
            if isinstance(val, ast.ColumnRef) and isinstance(val.fields[-1], ast.A_Star):
                items.append(SelectItem(None, to_sql(val), star=True))
                outputs.append((None, Expression("*", ())))
                continue
            expr = self._expression(val, _Ctx(entries, allow_aggregates=True))
            name = res.name or implicit_name(val)
            items.append(SelectItem(expr, name))
            outputs.append((name, expr))
        return tuple(items), outputs

    def _positional(self, node: ast.Node, outputs: list[tuple[str | None, Expression]],
                    clause: str) -> Expression | None:
        """The output a ``GROUP BY 2`` / ``ORDER BY 2`` names. A ``*`` expands to every
        column of its tables, so positions from the first ``*`` on are refused."""
        if isinstance(node, ast.A_Const) and isinstance(node.val, ast.Integer):
            pos = node.val.ival
            star = next((i for i, (n, e) in enumerate(outputs) if n is None and e.sql == "*"),
                        len(outputs))
            if not 1 <= pos <= star:
                where = "before its first *" if star < len(outputs) else ""
                raise UnsupportedQuery(f"{clause} position {pos} not in the select list {where}"
                                       .rstrip())
            return outputs[pos - 1][1]
        return None

    def _group_item(self, node: ast.Node, entries: list[_Entry],
                    outputs: list[tuple[str | None, Expression]]) -> Expression:
        found = self._positional(node, outputs, "GROUP BY")
        if found is not None:
            return found
        if isinstance(node, ast.ColumnRef) and len(node.fields) == 1:
            name = node.fields[0].sval
            aliased = [e for n, e in outputs if n == name]
            try:
                expr = self._expression(node, _Ctx(entries))
            except NeedsCatalog:
                raise
            except UnsupportedQuery:
                if len(aliased) == 1:  # an output name (input columns take precedence)
                    return aliased[0]
                raise
            if (self.resolver is None and any(e != expr for e in aliased)
                    and len(entries) == 1 and entries[0].table is not None):
                if not self.lenient:
                    raise NeedsCatalog(f"GROUP BY {name} may name an output column")
                self.resolved = False
            return expr
        return self._expression(node, _Ctx(entries))

    def _order_item(self, sort: ast.SortBy, entries: list[_Entry],
                    outputs: list[tuple[str | None, Expression]]) -> OrderItem:
        if sort.useOp:
            raise UnsupportedQuery("ORDER BY … USING")
        descending = sort.sortby_dir == SortByDir.SORTBY_DESC
        if sort.sortby_nulls == SortByNulls.SORTBY_NULLS_DEFAULT:
            nulls_first = descending
        else:
            nulls_first = sort.sortby_nulls == SortByNulls.SORTBY_NULLS_FIRST
        node = sort.node
        position: int | None = None
        expr = self._positional(node, outputs, "ORDER BY")
        if expr is not None:
            position = node.val.ival - 1
        elif isinstance(node, ast.ColumnRef) and len(node.fields) == 1:
            name = node.fields[0].sval
            matches = [i for i, (n, _) in enumerate(outputs) if n == name]
            if len({outputs[i][1] for i in matches}) > 1:
                raise UnsupportedQuery(f"ORDER BY {name} is ambiguous")
            if matches:
                position = matches[0]
                expr = outputs[position][1]
        if expr is None:
            expr = self._expression(node, _Ctx(entries, allow_aggregates=True))
            position = next((i for i, (_, e) in enumerate(outputs) if e == expr), None)
        return OrderItem(expr, descending, nulls_first, position)

    # ---- expressions -----------------------------------------------------------------

    def _expression(self, node: ast.Node, ctx: _Ctx) -> Expression:
        return self._finish(self._walk_node(node, ctx), ctx)

    def _finish(self, inlined: ast.Node, ctx: _Ctx) -> Expression:
        column = None
        if isinstance(inlined, ast.ColumnRef) and ctx.columns:
            column = ctx.columns[0]
        return Expression(to_sql(inlined), tuple(dict.fromkeys(ctx.columns)), column,
                          ctx.has_aggregate)

    def _walk(self, node: object, ctx: _Ctx) -> object:
        """A copy of ``node`` with column references qualified (subquery columns inlined),
        rejecting every node outside the supported class."""
        if node is None or isinstance(node, (str, int, float, bool)):
            return node
        if isinstance(node, tuple):
            return tuple(self._walk(n, ctx) for n in node)
        if isinstance(node, ast.ColumnRef):
            return self._column(node, ctx)
        if isinstance(node, ast.ParamRef):
            self.params.add(node.number)
            return copy.copy(node)
        if isinstance(node, LEAF_NODES):
            return copy.deepcopy(node)
        if isinstance(node, ast.FuncCall):
            return self._function(node, ctx)
        if isinstance(node, ast.A_Expr):
            if node.kind not in EXPR_KINDS:
                raise UnsupportedQuery(f"operator kind {node.kind.name}")
            self._operator(node)
        elif isinstance(node, ast.SubLink):
            raise UnsupportedQuery("subquery in an expression")
        elif isinstance(node, ast.SQLValueFunction):
            raise UnsupportedQuery("CURRENT_DATE/CURRENT_USER-like function")
        elif isinstance(node, ast.TypeCast):
            self._cast_type(node.typeName)
        elif isinstance(node, ast.CollateClause):
            self.collations.add(".".join('"' + n.sval.replace('"', '""') + '"'
                                         for n in node.collname))
        elif isinstance(node, ast.String) and reads_the_clock(node.sval):
            raise UnsupportedQuery(f"literal {node.sval!r} reads the clock")
        elif not isinstance(node, PLAIN_NODES):
            raise UnsupportedQuery(f"expression {type(node).__name__}")
        return self._rebuild(node, ctx)

    def _operator(self, node: ast.A_Expr) -> None:
        """Notes the operator names PostgreSQL looks up for ``node`` (BETWEEN: >= and <=)."""
        names = [n.sval for n in node.name]
        if len(names) > 1 and names[0] != "pg_catalog":
            raise UnsupportedQuery(f"operator {'.'.join(names)}")
        if node.kind == A_Expr_Kind.AEXPR_OP and names == ["="] and any(
                isinstance(side, ast.A_Const) and side.isnull for side in (node.lexpr, node.rexpr)):
            raise UnsupportedQuery("= NULL (IS NULL in a session with transform_null_equals)")
        if names[-1] in _TEXT_SEARCH_OPERATORS:
            raise UnsupportedQuery(f"text search operator {names[-1]} (reads "
                                   "default_text_search_config; a NOTICE per row read)")
        if names[-1] in _SHIFTS and _has_param(node.lexpr):
            raise UnsupportedQuery(f"a parameter shifted with {names[-1]} (its width is the "
                                   "client's type, in the capture the bound value's)")
        if node.kind in _BETWEEN_KINDS:
            self.operators.update((">=", "<="))
        else:
            self.operators.add(names[-1])

    def _cast_type(self, name: ast.TypeName) -> None:
        """Notes the type a cast names (:attr:`QueryAnalysis.types`)."""
        if name.pct_type or len(name.names) > 2:
            raise UnsupportedQuery("cast to a %TYPE or cross-database type")
        if name.names[-1].sval in CATALOG_NAME_TYPES:
            raise UnsupportedQuery(f"cast to {name.names[-1].sval} (reads the catalog)")
        self.types.add(RawStream()(name))

    def _walk_node(self, node: ast.Node, ctx: _Ctx) -> ast.Node:
        """``_walk`` for a node (never a tuple or scalar)."""
        out = self._walk(node, ctx)
        assert isinstance(out, ast.Node)
        return out

    def _rebuild(self, node: ast.Node, ctx: _Ctx) -> ast.Node:
        new = copy.copy(node)
        for attr in node:
            value = getattr(node, attr)
            if isinstance(value, (ast.Node, tuple)):
                setattr(new, attr, self._walk(value, ctx))
        return new

    def _function(self, node: ast.FuncCall, ctx: _Ctx) -> ast.Node:
        names = [n.sval for n in node.funcname]  # a quoted "SUM" is not sum
        name = names[-1]
        if len(names) > 1 and names[0] != "pg_catalog":
            raise UnsupportedQuery(f"function {'.'.join(names)}")
        if len(names) == 1:
            self.routines.add(name)
        self.calls.add(name)
        if node.over is not None:
            raise UnsupportedQuery("window function")
        if name in AGGREGATES:
            if not ctx.allow_aggregates:
                raise UnsupportedQuery(f"aggregate {name} outside the select list/HAVING/"
                                       "ORDER BY")
            if ctx.in_aggregate:
                raise UnsupportedQuery("nested aggregate")
            if node.agg_filter is not None or node.agg_order or node.agg_within_group:
                raise UnsupportedQuery("aggregate with FILTER/ORDER BY/WITHIN GROUP")
            if node.func_variadic or (not node.agg_star and len(node.args or ()) != 1):
                raise UnsupportedQuery(f"aggregate {name} with other than one argument")
            inner = _Ctx(ctx.entries, allow_aggregates=False, in_aggregate=True)
            new = self._rebuild(node, inner)
            ctx.columns.extend(inner.columns)
            ctx.has_aggregate = True
            arg = None
            if not node.agg_star:
                arg = Expression(to_sql(new.args[0]), tuple(dict.fromkeys(inner.columns)),
                                 inner.columns[0] if isinstance(new.args[0], ast.ColumnRef)
                                 and inner.columns else None)
            text = to_sql(new)
            self.aggregates.setdefault(text, AggregateCall(name, arg, bool(node.agg_distinct),
                                                           text))
            return new
        if name not in FUNCTIONS:
            raise UnsupportedQuery(f"function {name}")
        if node.agg_star or node.agg_distinct or node.agg_filter is not None:
            raise UnsupportedQuery(f"aggregate syntax on function {name}")
        return self._rebuild(node, ctx)

    # ---- column resolution -----------------------------------------------------------

    def _columns_of(self, entry: _Entry) -> frozenset[str] | None:
        if entry.table is None or self.resolver is None:
            return None
        if entry.table not in self.column_cache:
            t = self.tables[entry.table]
            cols = self.resolver(t.schema, t.name)
            if cols is None:
                raise UnsupportedQuery(f"unknown table {t.name}")
            self.column_cache[entry.table] = frozenset(cols)
        return self.column_cache[entry.table]

    def _column(self, node: ast.ColumnRef, ctx: _Ctx) -> ast.Node:
        fields = node.fields
        if any(isinstance(f, ast.A_Star) for f in fields):
            raise UnsupportedQuery("* outside the select list")
        names = [f.sval for f in fields]
        if len(names) == 1:
            entry = self._unqualified(names[0], ctx.entries)
        elif len(names) == 2:
            entry = next((e for e in ctx.entries if e.alias == names[0]), None)
        elif len(names) == 3:
            entry = next((e for e in ctx.entries if e.table is not None
                          and self.tables[e.table].schema == names[0]
                          and self.tables[e.table].name == names[1]
                          and self.tables[e.table].alias == names[1]), None)
        else:
            raise UnsupportedQuery("column reference with more than three parts")
        if entry is None:
            raise UnsupportedQuery(f"cannot resolve column {'.'.join(names)}")
        col = names[-1]
        if entry.outputs is not None:
            if col not in entry.outputs:
                raise UnsupportedQuery(f"no column {col} in subquery {entry.alias}")
            inlined, cols = entry.outputs[col]
            ctx.columns.extend(cols)
            return copy.deepcopy(inlined)
        known = self._columns_of(entry)
        if known is not None and col not in known:
            raise UnsupportedQuery(f"no column {col} in {entry.alias}")
        assert entry.table is not None
        ctx.columns.append(ColumnRef(entry.table, col))
        return ast.ColumnRef(fields=(ast.String(sval=entry.alias), ast.String(sval=col)))

    def _unqualified(self, col: str, entries: list[_Entry]) -> _Entry | None:
        if len(entries) == 1:
            return entries[0]
        matches: list[_Entry] = []
        unknown: list[_Entry] = []
        for e in entries:
            if e.outputs is not None:
                if col in e.outputs:
                    matches.append(e)
                continue
            known = self._columns_of(e)
            if known is None:
                unknown.append(e)
            elif col in known:
                matches.append(e)
        if unknown:
            self.resolved = False
            if len(unknown) == 1 and not matches:
                return unknown[0]
            if self.lenient:
                return (matches + unknown)[0]
            raise NeedsCatalog(f"unqualified column {col} in a join needs the catalog")
        if len(matches) != 1:
            raise UnsupportedQuery(f"column {col} is {'ambiguous' if matches else 'unknown'}")
        return matches[0]


def _column_equality(node: object, an: _Analyser) -> tuple[ColumnRef, ColumnRef] | None:
    """``(l, r)`` when ``node`` is ``a.x = b.y`` over two different base tables."""
    if not (isinstance(node, ast.A_Expr) and node.kind == A_Expr_Kind.AEXPR_OP
            and len(node.name) == 1 and node.name[0].sval == "="):
        return None
    sides = []
    for side in (node.lexpr, node.rexpr):
        if not (isinstance(side, ast.ColumnRef) and len(side.fields) == 2):
            return None
        alias, col = side.fields[0].sval, side.fields[1].sval
        t = next((t for t in an.tables if t.alias == alias), None)
        if t is None:
            return None
        sides.append(ColumnRef(t.index, col))
    if sides[0].table == sides[1].table:
        return None
    return sides[0], sides[1]
