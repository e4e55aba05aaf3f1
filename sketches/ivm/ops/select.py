"""Selection σθ (IMP §5.2.3).

Delta rule: σ is linear, ``σ(R + ΔR) = σ(R) + σ(ΔR)``; a passing tuple keeps its annotation
(its own provenance suffices to produce it) and multiplicity. Stateless. In a pipeline whose
subtree below the selection is stateless the predicate is pushed into the delta fetch instead
(:mod:`sketches.deltas`); this operator evaluates Python :mod:`sketches.ivm.expr` predicates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, TypeVar

from sketches.ivm.errors import NotMaintainable
from sketches.ivm.expr import (
    _CMP,
    And,
    Cmp,
    Col,
    Const,
    Expr,
    Or,
    as_float8,
    check_kinds,
    columns,
    combine,
    is_nan,
    temporal_kind,
)
from sketches.ivm.operator import Operator
from sketches.ivm.zset import Row, ZSet

Eval = Callable[[Row], object]
T = TypeVar("T")


class Select(Operator):
    kind = "select"

    def __init__(self, predicate: Expr) -> None:
        self.predicate = predicate
        self._test = _compile(predicate)
        self.columns = columns(predicate)
        """The row positions the predicate reads."""

    @property
    def test(self) -> Eval:
        """The predicate as a function of a row: True, False or None (SQL's unknown)."""
        return self._test

    def step(self, delta: ZSet) -> ZSet:
        # holds() inlined: `test(row) is True`; a filtered consolidated dict stays consolidated
        test = self._test
        return ZSet.from_dict({key: w for key, w in delta.items() if test(key[0]) is True})


def _compile(expr: Expr) -> Eval:
    """``expr.eval`` as a closure: the usual HAVING shapes (AND/OR of comparisons between a
    column and a constant) then cost one Python call per comparison instead of three. Same
    three-valued results and errors as :mod:`sketches.ivm.expr`; other nodes use ``eval``."""
    if type(expr) is Or or type(expr) is And:
        return connective([_compile(a) for a in expr.args], type(expr) is Or, expr.every)
    compared = column_and_constant(expr)
    if compared is not None:
        assert isinstance(expr, Cmp)
        return column_vs_constant(expr.op, *compared)
    return expr.eval


def column_and_constant(expr: Expr) -> tuple[int, object] | None:
    """``(column, constant)`` when ``expr`` compares a column with a non-NULL, non-text
    constant — the comparisons the compiled tests evaluate themselves; None otherwise."""
    if (type(expr) is Cmp and type(expr.left) is Col and type(expr.right) is Const
            and expr.right.value is not None and not isinstance(expr.right.value, str)):
        return expr.left.index, expr.right.value
    return None


def connective(args: Sequence[Callable[[T], object]], is_or: bool,
               every: bool = False) -> Callable[[T], object]:
    """OR (``is_or``) / AND of tests with SQL's three-valued logic, as :class:`Or` /
    :class:`And`: the tests after a decisive one are not run, unless ``every``."""
    if every:
        return lambda row: combine([arg(row) for arg in args], is_or)
    decisive = is_or   # OR stops at TRUE, AND at FALSE

    def test(row: T) -> object:
        unknown = False
        for arg in args:
            v = arg(row)
            if v is decisive:
                return decisive
            if v is None:
                unknown = True
        return None if unknown else not decisive
    return test


def column_vs_constant(op: str, col: int, const: object) -> Eval:
    """:class:`Cmp` of ``row[col]`` with a non-NULL, non-text constant."""
    test = value_vs_constant(op, const)
    return lambda row: test(row[col])


def value_vs_constant(op: str, const: object) -> Callable[[object], object]:
    """:class:`Cmp` of a value with a non-NULL, non-text constant (a float8 on either side:
    compared as float8, as in PostgreSQL: :func:`sketches.ivm.expr.as_float8`; a date/time
    constant only with a value of its own kind: :func:`sketches.ivm.expr.check_kinds`)."""
    compare = _CMP[op]
    if temporal_kind(const) is not None:
        return _temporal_vs_constant(compare, const)
    float_const = type(const) is float
    nan_const = is_nan(const)

    def test(a: object) -> object:
        if a is None:
            return None
        if isinstance(a, str):   # as Cmp.eval: text beside a non-text constant
            raise NotMaintainable("a text value compared with a non-text constant")
        if float_const or type(a) is float:
            return compare(as_float8(a), as_float8(const))
        if nan_const or (type(a) is Decimal and a.is_nan()):   # as Cmp.eval
            raise NotMaintainable("comparison with NaN is not evaluated here")
        return compare(a, const)
    return test


def _temporal_vs_constant(compare: Callable[[Any, Any], Any],
                          const: object) -> Callable[[object], object]:
    """:func:`value_vs_constant` for a date/time constant."""
    kind = temporal_kind(const)

    def test(a: object) -> object:
        if a is None:
            return None
        if temporal_kind(a) != kind:
            check_kinds(a, const)
        return compare(a, const)
    return test
