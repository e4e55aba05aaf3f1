"""The analysed form of a query of the supported class (what ``analyse()`` returns).

The analysis *flattens* the query: plain SPJ subqueries in FROM are inlined, so every
expression is written over the base tables only, each column qualified with its table's
exposed name (``TableRef.alias``, unique across the whole query). The query is then

    SELECT [DISTINCT] select
    FROM   tables (all inner-joined)
    WHERE  AND(join_equalities) AND AND(where)
    [GROUP BY group_by] [HAVING having]
    [ORDER BY order_by] [LIMIT limit]

with ``aggregates`` listing every aggregate call of the select list, HAVING and ORDER BY. This
is the input from which the incremental engine compiles its operator tree
(scan per table → select → join on ``join_equalities`` → aggregate → having → top-k).

Every ``Expression.sql`` is PostgreSQL syntax printed by pglast; parameters stay ``$n``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TableRef:
    """One base table occurrence.

    ``schema`` is the schema as written (``None``: resolved through ``search_path``),
    ``alias`` the name the query uses for it (its alias, else the relation name) — unique in
    the query. ``scope`` is the SELECT whose FROM lists it: 0 is the top level, FROM
    subqueries are numbered in pre-order (see ``sketches.sql.parse.scopes``).
    """

    index: int
    schema: str | None
    name: str
    alias: str
    scope: int
    resolved: str | None = None
    """Of a table written without a schema, the one its sketch's texts name it in
    (:meth:`QueryAnalysis.with_schemas`); None: resolved through ``search_path``."""

    @property
    def qualifier(self) -> str | None:
        """The schema the library's texts name the table in: as written, else resolved."""
        return self.schema if self.schema is not None else self.resolved


@dataclass(frozen=True, slots=True)
class ColumnRef:
    """A column of a base table: ``tables[table].alias`` + ``.`` + ``column``."""

    table: int
    column: str


@dataclass(frozen=True, slots=True)
class Expression:
    """A scalar expression over the base tables.

    ``columns``: the base columns it reads; ``column``: set when the expression *is* a single
    base column (after inlining subqueries); ``has_aggregate``: it contains an aggregate call.
    """

    sql: str
    columns: tuple[ColumnRef, ...]
    column: ColumnRef | None = None
    has_aggregate: bool = False


@dataclass(frozen=True, slots=True)
class AggregateCall:
    """``func([DISTINCT] arg)``; ``arg`` is ``None`` for ``count(*)``."""

    func: str  # count | sum | avg | min | max
    arg: Expression | None
    distinct: bool
    sql: str


@dataclass(frozen=True, slots=True)
class SelectItem:
    """One output column; ``name`` is its alias (or the column name PostgreSQL would use for a
    plain column reference); ``expr`` is ``None`` only for ``*``."""

    expr: Expression | None
    name: str | None
    star: bool = False


@dataclass(frozen=True, slots=True)
class OrderItem:
    """One ORDER BY key with PostgreSQL's effective NULL placement (``nulls_first`` defaults
    to ``descending``). ``output`` is the select-list position (0-based) it refers to, if any."""

    expr: Expression
    descending: bool
    nulls_first: bool
    output: int | None = None


@dataclass(frozen=True, slots=True)
class Limit:
    """``LIMIT k``: either a constant ``value`` or parameter number ``param`` (``$param``)."""

    value: int | None
    param: int | None

    def resolve(self, params: tuple[object, ...] | list[object] | None) -> int | None:
        """The numeric k (``None`` if it is a parameter that was not supplied)."""
        if self.value is not None:
            return self.value
        if params is not None and self.param is not None and self.param <= len(params):
            v = params[self.param - 1]
            try:
                return int(v) if isinstance(v, (int, str)) else None
            except ValueError:
                return None
        return None


@dataclass(frozen=True, slots=True)
class Scope:
    """A SELECT of the query: 0 = top level; others are FROM subqueries, ``parent`` is the
    enclosing scope and ``alias`` the subquery's alias there."""

    index: int
    parent: int | None
    alias: str | None


@dataclass(frozen=True, slots=True)
class QueryAnalysis:
    """A query of the supported class, flattened (see the module docstring)."""

    sql: str
    tables: tuple[TableRef, ...]
    scopes: tuple[Scope, ...]
    join_equalities: tuple[tuple[ColumnRef, ColumnRef], ...]
    where: tuple[Expression, ...]
    group_by: tuple[Expression, ...]
    aggregates: tuple[AggregateCall, ...]
    having: Expression | None
    order_by: tuple[OrderItem, ...]
    limit: Limit | None
    distinct: bool
    select: tuple[SelectItem, ...]
    params: tuple[int, ...]
    resolved: bool
    """True when every column reference was resolved against the catalog (or needed not be)."""
    routines: frozenset[str] = frozenset()
    """Names of the functions and aggregates the query calls unqualified (PostgreSQL looks
    them up on the search_path)."""
    operators: frozenset[str] = frozenset()
    """Names of the operators the query uses (also looked up on the search_path)."""
    calls: frozenset[str] = frozenset()
    """Names of every function and aggregate the query calls, qualified or not."""
    types: frozenset[str] = frozenset()
    """The type names of the query's casts, as written (a name without a schema is looked up
    on the search_path)."""
    collations: frozenset[str] = frozenset()
    """The collation names of the query's COLLATE clauses, each part double-quoted (a name
    without a schema is looked up on the search_path)."""

    def columns_read(self) -> tuple[ColumnRef, ...] | None:
        """Every base column the query reads, in first-read order; None when it reads them
        all (``*`` in the select list)."""
        if any(item.star for item in self.select):
            return None
        exprs = [*self.where, *self.group_by, *(a.arg for a in self.aggregates if a.arg),
                 *(i.expr for i in self.select if i.expr is not None),
                 *(o.expr for o in self.order_by)]
        if self.having is not None:
            exprs.append(self.having)
        refs = [c for e in exprs for c in e.columns]
        refs += [c for pair in self.join_equalities for c in pair]
        return tuple(dict.fromkeys(refs))

    def with_schemas(self, schemas: Iterable[tuple[int, str, str]]) -> QueryAnalysis:
        """This analysis with each table of ``schemas`` (``(scope, alias, schema)``) written
        without a schema resolved to that one (``TableRef.resolved``; its ``schema`` stays
        as written, and so does the plan fingerprint of a state persisted before). Why: the
        texts made from it (capture, state build, delta reads) then name the relations their
        caller resolved and locked, whatever the search_path finds when they are parsed — a
        same-named table created earlier on it in between would be read in the older
        snapshot, empty."""
        wanted = {(scope, alias): schema for scope, alias, schema in schemas}
        tables = tuple(
            dataclasses.replace(t, resolved=wanted[(t.scope, t.alias)])
            if t.schema is None and (t.scope, t.alias) in wanted else t
            for t in self.tables)
        return self if tables == self.tables else dataclasses.replace(self, tables=tables)

    @property
    def is_aggregate(self) -> bool:
        """GROUP BY, aggregate calls or HAVING present."""
        return bool(self.group_by or self.aggregates or self.having is not None)

    @property
    def is_topk(self) -> bool:
        """ORDER BY … LIMIT k."""
        return self.limit is not None and bool(self.order_by)

    def table(self, ref: ColumnRef) -> TableRef:
        return self.tables[ref.table]

    def qualified(self, ref: ColumnRef) -> str:
        """``alias.column`` (unquoted; for messages and keys)."""
        return f"{self.tables[ref.table].alias}.{ref.column}"
