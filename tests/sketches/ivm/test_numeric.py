"""Decimal + − × as PostgreSQL's numeric computes them: exact, however many digits."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from sketches.ivm import numeric
from sketches.ivm.ops.accumulators import SumAcc

wide = st.one_of(st.integers(-10**40, 10**40),
                 st.decimals(-10**30, 10**30, places=12, allow_nan=False, allow_infinity=False))


@settings(max_examples=300, deadline=None)
@given(wide, wide)
def test_arithmetic_is_exact(a: int | Decimal, b: int | Decimal) -> None:
    for f, exact in ((numeric.add, Fraction(a) + Fraction(b)),
                     (numeric.subtract, Fraction(a) - Fraction(b)),
                     (numeric.multiply, Fraction(a) * Fraction(b))):
        got = f(a, b)
        assert Fraction(got) == exact
        assert type(got) is (int if type(a) is int and type(b) is int else Decimal)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(wide, st.sampled_from([1, -1, 2])), max_size=12))
def test_running_sum_is_exact(changes: list[tuple[int | Decimal, int]]) -> None:
    """Added and absorbed alike (the per-row and the pre-aggregated paths). A weight that would
    take the non-NULL count below zero is flipped; an emptied sum restarts from 0."""
    added, absorbed = SumAcc(), SumAcc()
    want, count = Fraction(0), 0
    for value, weight in changes:
        if count + weight < 0:
            weight = -weight
        added.add(value, weight)
        absorbed.absorb((numeric.multiply(value, weight), weight))
        count += weight
        want = Fraction(value) * weight + want if count else Fraction(0)
        for acc in (added, absorbed):
            assert acc.nonnull == count and Fraction(acc.total) == want
