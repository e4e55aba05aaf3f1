"""HAVING evaluated on a group's accumulators, lazily (``Aggregate.step_sketch``).

Why: a HAVING test over an output row first computes every aggregate it reads — avg with
PostgreSQL's exact numeric division (:func:`pg_numeric_div`, most of the per-group time of an
avg HAVING) — although an OR stops at its first true comparison and an average is rarely
within rounding distance of the constant it is compared with. Here a comparison reads its
aggregate only when it is reached, and ``avg(integer column) op constant`` is decided by
integer arithmetic on the running sum and count unless the exact quotient lies so close to
the constant that PostgreSQL's rounding of it could matter; only then is the rounded average
computed. Same three-valued results and errors as the row test
(:class:`sketches.ivm.ops.select.Select`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, cast

from sketches.ivm.expr import _CMP, And, Cmp, Expr, Or, is_nan
from sketches.ivm.ops.accumulators import Accumulator
from sketches.ivm.ops.select import column_and_constant, connective, value_vs_constant
from sketches.ivm.zset import Row

GroupView = tuple[Row, Sequence[Accumulator]]
"""A group's key and its accumulators, in aggregate order."""
GroupEval = Callable[[GroupView], object]

SLACK = 10 ** 14
"""PostgreSQL rounds ``sum / count`` to at least 16 significant digits (``select_div_scale``):
the rounded average is within ``|quotient| · 10^-16 / 2`` of the exact one. A comparison is
decided exactly when the quotient is farther from the constant than ``|quotient| · 10^-14 / 2``
(a hundredfold margin)."""

_DECIDED: dict[str, Callable[[bool], bool]] = {
    ">=": lambda above: above, ">": lambda above: above,
    "<=": lambda above: not above, "<": lambda above: not above,
    "=": lambda above: False, "<>": lambda above: True, "!=": lambda above: True,
}
"""A comparison ``avg op constant`` when the average is known to differ from the constant
(``above``: it is greater)."""


def compile_group_test(expr: Expr, width: int, funcs: Sequence[str]) -> GroupEval | None:
    """``expr`` — over output rows of ``width`` group keys and one column per aggregate (of
    functions ``funcs``) — as a test of a :data:`GroupView`; None unless it is an AND/OR tree
    of comparisons of a column with a non-NULL, non-text constant (then the caller tests
    output rows)."""
    compiled = _compile(expr, width, funcs)
    return None if compiled is None else compiled[0]


IntLeaf = tuple[int, Callable[[object, object], object], object, int]
"""``(i, compare, constant, read)``: a comparison of aggregate ``i`` that, when its result
is an int, is ``compare(result, constant)`` (:func:`_aggregate_vs_constant`); ``read``: how
the result is read (:data:`_READ`)."""


def _compile(expr: Expr, width: int, funcs: Sequence[str]
             ) -> tuple[GroupEval, IntLeaf | None] | None:
    """:func:`compile_group_test`, with the :data:`IntLeaf` of a plain aggregate comparison."""
    if type(expr) is Or or type(expr) is And:
        args = [_compile(a, width, funcs) for a in expr.args]
        if any(a is None for a in args):
            return None
        pairs = cast(list[tuple[GroupEval, IntLeaf | None]], args)
        if any(leaf is not None for _test, leaf in pairs):
            return _flat_connective(pairs, type(expr) is Or), None
        return connective([test for test, _leaf in pairs], type(expr) is Or), None
    compared = column_and_constant(expr)
    if compared is None:
        return None
    assert isinstance(expr, Cmp)
    col, const = compared
    if col < width:
        on_key = value_vs_constant(expr.op, const)
        return (lambda view: on_key(view[0][col])), None
    scaled = _scaled_int(const) if funcs[col - width] == "avg" else None
    if scaled is not None:
        return _average_vs_constant(expr.op, col - width, const, *scaled), None
    test = _aggregate_vs_constant(expr.op, col - width, const)
    plain = not (type(const) is float or is_nan(const))
    kind = _READ.get(funcs[col - width], _RESULT)
    return test, ((col - width, _CMP[expr.op], const, kind) if plain else None)


_RESULT, _SUM_TOTAL, _COUNT = 0, 1, 2
_READ = {"sum": _SUM_TOTAL, "count": _COUNT, "count_star": _COUNT}
"""How an :data:`IntLeaf` reads its aggregate: ``result()``, or (a call less) a sum's
``total`` while it has a non-NULL value, a count's ``nonnull`` (``SumAcc``, ``CountAcc``)."""


def _flat_connective(args: Sequence[tuple[GroupEval, IntLeaf | None]],
                     is_or: bool) -> GroupEval:
    """:func:`connective` of ``args`` with each :data:`IntLeaf` evaluated inline (its own
    test only for a result that is no int). Why: HAVING over many aggregates (``sum(a) >= x
    OR sum(b) >= y …``) tests every touched group twice per batch, and a call per comparison
    was most of that time (found profiling the maintenance benchmark's 10-aggregate shape).
    Same three-valued results and errors: each comparison is the one its test makes."""
    steps: list[tuple[int, GroupEval, Callable[[Any, Any], Any], object, int]] = [
        (-1, test, _CMP["="], None, _RESULT) if leaf is None else (leaf[0], test, *leaf[1:])
        for test, leaf in args]
    decisive = is_or   # OR stops at TRUE, AND at FALSE

    def test(view: GroupView) -> object:
        accs = view[1]
        unknown = False
        for i, general, compare, const, read in steps:
            if i < 0:
                v = general(view)
            elif read == _SUM_TOTAL:
                acc: Any = accs[i]
                a = acc.total
                v = compare(a, const) if type(a) is int and acc.nonnull else general(view)
            elif read == _COUNT:
                v = compare(accs[i].nonnull, const)
            else:
                a = accs[i].result()
                v = compare(a, const) if type(a) is int else general(view)
            if v is decisive:
                return decisive
            if v is None:
                unknown = True
        return None if unknown else not decisive
    return test


def _aggregate_vs_constant(op: str, i: int, const: object) -> GroupEval:
    """The comparison of aggregate ``i``'s result with ``const`` (an int result, the common
    case, compared right here: what :func:`value_vs_constant` does for it, a call less)."""
    test = value_vs_constant(op, const)
    if type(const) is float or is_nan(const):   # an int compared with a NaN: InvalidOperation
        return lambda view: test(view[1][i].result())
    compare = _CMP[op]

    def leaf(view: GroupView) -> object:
        a = view[1][i].result()
        return compare(a, const) if type(a) is int else test(a)
    return leaf


def _average_vs_constant(op: str, i: int, const: object, m: int, scale: int) -> GroupEval:
    """:func:`_aggregate_vs_constant` for avg ``i`` and ``const == m / 10**scale``: decided
    without the division when the average is of integers and not within PostgreSQL's
    rounding of the constant (:data:`SLACK`)."""
    p = 10 ** scale
    decided = _DECIDED[op]
    otherwise = _aggregate_vs_constant(op, i, const)

    def leaf(view: GroupView) -> object:
        acc = view[1][i]
        total = acc.total  # type: ignore[union-attr]
        count = acc.nonnull
        if type(total) is int and count > 0:
            diff = total * p - m * count      # sign of (total / count − const)
            if 2 * abs(diff) * SLACK > abs(total) * p:
                return decided(diff > 0)
        return otherwise(view)
    return leaf


def _scaled_int(const: object) -> tuple[int, int] | None:
    """``(m, scale)`` with ``const == m / 10**scale`` exactly, for an int (not bool) or a finite
    Decimal; None for anything else."""
    if type(const) is int:
        return const, 0
    if not isinstance(const, Decimal) or not const.is_finite():
        return None
    sign, digits, exp = const.as_tuple()
    assert isinstance(exp, int)
    m = int("".join(map(str, digits))) if digits else 0
    if sign:
        m = -m
    return (m * 10 ** exp, 0) if exp >= 0 else (m, -exp)
