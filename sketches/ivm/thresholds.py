"""min/max compared with a constant in HAVING, maintained as counts (``Options.minmax_counts``).

Why: a sketch needs of a group only whether its row passes HAVING. For ``max(x) >= c`` that
is "some row has ``x >= c``": a count of such rows decides it, and a count is maintained by
adding the delta's count, pre-aggregated in PostgreSQL like any other — where a max needs a
sorted buffer of values per group, fed by value-level deltas (a ``GROUPING SETS`` read) and
refilled from PostgreSQL when deletions empty it. The comparison ``x >= c`` itself is then
evaluated by PostgreSQL, with its own types, collations and NaN rules.

The rewrite, per leaf (``N``: the group has a non-NULL ``x``; ``E(op)``: some row has
``x op c`` true; ``Z(op)``: none has):

====================  =====================  ====================  =====================
``max(x) >= c``       ``E(>=)``              ``min(x) <= c``       ``E(<=)``
``max(x) > c``        ``E(>)``               ``min(x) < c``        ``E(<)``
``max(x) <= c``       ``N AND Z(>)``         ``min(x) >= c``       ``N AND Z(<)``
``max(x) < c``        ``N AND Z(>=)``        ``min(x) > c``        ``N AND Z(<=)``
====================  =====================  ====================  =====================

Each is exact where ``x`` has a non-NULL value (max and ``>=`` use the same ordering of the
type); with none, the original leaf is NULL and the rewrite FALSE. That changes no HAVING
verdict when every rewritten leaf is reached from the root through AND and OR only: AND and OR
are TRUE exactly when all / some arguments are TRUE, so lowering a NULL argument to FALSE
never makes a TRUE result untrue nor a non-TRUE one TRUE, and HAVING keeps a row only when
its predicate is TRUE. So an aggregate is rewritten only when every reference to it in HAVING
is such a leaf, against a non-NULL integer or finite numeric constant, and nothing but HAVING
reads it (no ORDER BY: the caller checks). For the same reason an aggregate HAVING does not
read at all is not maintained: the sketch depends only on HAVING's verdicts (and on which
groups exist, which the row count tells). Except sum and avg: PostgreSQL computes every
group's and raises when one overflows numeric (a sum of unconstrained numerics past 131,072
digits, :func:`sketches.ivm.numeric.checked`), also in a group the sketch skips; only a
maintained sum sees it (found by a helper's search: ``SELECT g, sum(a) … HAVING count(*) >
70`` answered rows where PostgreSQL raises 22003).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from decimal import Decimal

from sketches.ivm.expr import And, Arith, Cmp, Col, Const, Expr, IsNull, Not, Or

_FLIP = {">=": "<=", ">": "<", "<=": ">=", "<": ">"}
_EXISTS = {("max", ">="): ">=", ("max", ">"): ">", ("min", "<="): "<=", ("min", "<"): "<"}
_NONE = {("max", "<="): ">", ("max", "<"): ">=", ("min", ">="): "<", ("min", ">"): "<="}


@dataclass(frozen=True, slots=True)
class Counter:
    """A count aggregate standing in for min/max ``agg``: the rows whose argument ``x``
    satisfies ``x op const`` (``op`` None: whose ``x`` is not NULL)."""

    agg: int
    op: str | None = None
    const: int | Decimal | None = None

    def condition_sql(self, arg: str) -> str:
        """The argument of the count in SQL, over the min/max argument's SQL ``arg``: NULL
        where the row does not count."""
        if self.op is None:
            return arg
        return f"CASE WHEN ({arg}) {self.op} ({self.const}) THEN 1 END"


@dataclass(frozen=True, slots=True)
class Rewrite:
    """HAVING over the new aggregate list: the ``kept`` aggregates (old indexes, in order)
    followed by the ``counters``; the others are gone."""

    having: Expr
    kept: tuple[int, ...]
    counters: tuple[Counter, ...]


def rewrite(having: Expr, width: int, funcs: Sequence[str]) -> Rewrite | None:
    """HAVING (over ``width`` group columns and aggregates of ``funcs``) with every min/max
    that qualifies (see the module) replaced by counts, and without the counts, mins and
    maxes it does not read (nothing else reads them); None when that changes nothing."""
    refs: dict[int, list[bool]] = {}
    _collect(having, width, True, refs)
    chosen = {i for i, ok in refs.items()
              if funcs[i] in ("min", "max") and all(ok)}
    kept = tuple(i for i, func in enumerate(funcs)
                 if (i in refs or func in ("sum", "avg")) and i not in chosen)
    if not chosen and len(kept) == len(funcs):
        return None
    counters: list[Counter] = []

    def counter(c: Counter) -> Expr:
        if c not in counters:
            counters.append(c)
        return Col(width + len(kept) + counters.index(c))

    def walk(e: Expr) -> Expr:
        if isinstance(e, And | Or):
            return type(e)(tuple(walk(a) for a in e.args))
        leaf = _leaf(e, width)
        if leaf is not None and leaf[0] in chosen:
            i, op, const = leaf
            exists = _EXISTS.get((funcs[i], op))
            if exists is not None:
                return Cmp(">", counter(Counter(i, exists, const)), Const(0))
            return And((Cmp(">", counter(Counter(i)), Const(0)),
                        Cmp("=", counter(Counter(i, _NONE[funcs[i], op], const)), Const(0))))
        return _renumber(e, width, kept)

    return Rewrite(walk(having), kept, tuple(counters))


def _leaf(e: Expr, width: int) -> tuple[int, str, int | Decimal] | None:
    """``(aggregate, op, constant)`` of ``agg op constant`` or ``constant op agg`` (op one of
    < <= > >=, the constant a non-NULL int or finite Decimal), normalised to the aggregate on
    the left; else None."""
    if not isinstance(e, Cmp) or e.op not in _FLIP:
        return None
    col, const, op = e.left, e.right, e.op
    if isinstance(const, Col):
        col, const, op = const, col, _FLIP[op]
    if not isinstance(col, Col) or col.index < width or not isinstance(const, Const):
        return None
    v = const.value
    if not (type(v) is int or (type(v) is Decimal and v.is_finite())):
        return None
    return col.index - width, op, v


def _collect(e: Expr, width: int, monotone: bool, refs: dict[int, list[bool]]) -> None:
    """Every reference to an aggregate column under ``e``, each marked whether it is a
    rewritable leaf reached through AND/OR only."""
    if isinstance(e, And | Or):
        for a in e.args:
            _collect(a, width, monotone, refs)
    elif (leaf := _leaf(e, width)) is not None:
        refs.setdefault(leaf[0], []).append(monotone)
    elif isinstance(e, Col):
        if e.index >= width:
            refs.setdefault(e.index - width, []).append(False)
    elif isinstance(e, Cmp | Arith):
        _collect(e.left, width, False, refs)
        _collect(e.right, width, False, refs)
    elif isinstance(e, Not | IsNull):
        _collect(e.arg, width, False, refs)


def _renumber(e: Expr, width: int, kept: Sequence[int]) -> Expr:
    """``e`` with aggregate columns moved to their positions among ``kept``."""
    if isinstance(e, Col):
        return e if e.index < width else Col(width + kept.index(e.index - width))
    if isinstance(e, And | Or):
        return type(e)(tuple(_renumber(a, width, kept) for a in e.args))
    if isinstance(e, Cmp | Arith):   # replace: an Arith keeps its text and result type
        return replace(e, left=_renumber(e.left, width, kept),
                       right=_renumber(e.right, width, kept))
    if isinstance(e, Not):
        return Not(_renumber(e.arg, width, kept))
    if isinstance(e, IsNull):
        return IsNull(_renumber(e.arg, width, kept), e.negated)
    return e
