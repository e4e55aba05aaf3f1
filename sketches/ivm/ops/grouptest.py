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
from typing import cast

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
    if type(expr) is Or or type(expr) is And:
        args = [compile_group_test(a, width, funcs) for a in expr.args]
        if any(a is None for a in args):
            return None
        return connective(cast(list[GroupEval], args), type(expr) is Or)
    compared = column_and_constant(expr)
    if compared is None:
        return None
    assert isinstance(expr, Cmp)
    col, const = compared
    if col < width:
        on_key = value_vs_constant(expr.op, const)
        return lambda view: on_key(view[0][col])
    scaled = _scaled_int(const) if funcs[col - width] == "avg" else None
    if scaled is None:
        return _aggregate_vs_constant(expr.op, col - width, const)
    return _average_vs_constant(expr.op, col - width, const, *scaled)


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
