"""Answer comparison: multisets vs ordered sequences, float rounding."""

from __future__ import annotations

from decimal import Decimal

from bench.compare import compare


def test_multiset_ignores_order_but_counts_duplicates() -> None:
    assert compare([(1, "a"), (2, "b")], [(2, "b"), (1, "a")], ordered=False).equal
    assert not compare([(1, "a"), (1, "a")], [(1, "a")], ordered=False).equal


def test_ordered_compares_order() -> None:
    assert compare([(1,), (2,)], [(1,), (2,)], ordered=True).equal
    res = compare([(2,), (1,)], [(1,), (2,)], ordered=True)
    assert not res.equal and "row 0" in res.detail


def test_float_last_bits_and_exact_types() -> None:
    assert compare([(0.1 + 0.2,)], [(0.3,)], ordered=True).equal
    assert not compare([(0.3001,)], [(0.3,)], ordered=True).equal
    assert not compare([(Decimal("1.10"),)], [(Decimal("1.11"),)], ordered=False).equal
