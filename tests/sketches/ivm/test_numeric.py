"""Decimal + − × as PostgreSQL's numeric computes them: exact, however many digits; NaN and
±Infinity refused wherever Python would compute or compare them otherwise than PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sketches.ivm import numeric
from sketches.ivm.errors import NotMaintainable
from sketches.ivm.expr import Arith, Cmp, Col, Const
from sketches.ivm.ops.accumulators import SumAcc, ValueBuffer, best_values, pg_numeric_div
from sketches.ivm.ops.aggregate import Aggregate, AggSpec
from sketches.ivm.ops.grouptest import compile_group_test
from sketches.ivm.ops.select import Select
from sketches.ivm.ops.topk import OrderItem, TopK
from sketches.ivm.zset import ZSet

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


scaled = st.builds(lambda n, s: Decimal(n).scaleb(-s), st.integers(-999, 999), st.integers(0, 20))


def _pg_sum(values: list[Decimal]) -> Decimal:
    """PostgreSQL's sum: exact, with the largest scale of the values (as Python's exact
    addition keeps the finest exponent)."""
    total = Decimal(0)
    for v in values:
        total = numeric.add(total, v)
    return total


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(scaled, min_size=1, max_size=4), min_size=1, max_size=3),
       st.lists(st.tuples(st.booleans(), scaled, st.integers(0, 30)), max_size=10),
       st.booleans(), st.booleans())
def test_sum_and_avg_have_the_scale_of_the_values_present(
        fragments: list[list[Decimal]], changes: list[tuple[bool, Decimal, int]],
        avg: bool, absorbed: bool) -> None:
    """A state built from per-fragment partial sums (``load_partial``), then values inserted
    and deleted one by one (``add`` or ``absorb``): a sum has PostgreSQL's value (compared
    and added, its scale does not count, and it never refuses), an avg its value *and
    scale*, which its division rounds to (a running sum kept the scale of a deleted value:
    avg of 1, 1, 2 after ``1 → 1.00000000000000000000 → 1`` was 1.33333333333333333333,
    PostgreSQL's 1.3333333333333333) — or, when the state cannot know the largest scale
    present (values of the build were not counted one by one), it refuses."""
    acc, present = SumAcc(avg=avg), []
    for part in fragments:
        acc.load_partial(_pg_sum(part), len(part))
        present += part
    for insert, value, pick in changes:
        if not insert:
            if not present:
                continue
            value = present.pop(pick % len(present))
        else:
            present.append(value)
        weight = 1 if insert else -1
        if absorbed:
            acc.absorb((numeric.multiply(value, weight), weight))
        else:
            acc.add(value, weight)
        want = None
        if present:
            total = _pg_sum(present)
            want = pg_numeric_div(total, len(present)) if avg else total
        try:
            got = acc.result()
        except NotMaintainable:
            assert avg, "a sum's value needs no scale"
            continue
        assert str(got) == str(want) if avg else got == want


def test_a_fixed_scale_counts_the_values_the_build_did_not() -> None:
    """``numeric(p, s)``: every value has scale ``s``; a delete leaving no counted value no
    longer makes the scale unknown (it refused: a recapture per group and delete)."""
    acc = SumAcc(avg=True)
    acc.load_partial(Decimal("6.00"), 3)
    acc.absorb((Decimal("-2.00"), -1, 2))
    assert str(acc.result()) == "2.0000000000000000"


@pytest.mark.parametrize("value", [Decimal("NaN"), Decimal("Infinity"), Decimal("-Infinity"),
                                   float("nan"), float("inf")])
def test_a_non_finite_value_is_refused(value: object) -> None:
    """PostgreSQL counts NaN and ±Infinity apart from the finite sum; a running sum kept NaN
    after the NaN row was deleted (NaN − NaN): refused wherever one enters or leaves."""
    for enter in (lambda a: a.add(value, 1), lambda a: a.absorb((value, 1)),
                  lambda a: a.load_partial(value, 1)):
        with pytest.raises(NotMaintainable):
            enter(SumAcc())
    with pytest.raises(NotMaintainable):
        numeric.finite_difference(Decimal(1), value)


NANS = [Decimal("NaN"), float("nan")]


@pytest.mark.parametrize("nan", NANS)
@pytest.mark.parametrize("op", [">", "<", "=", "<>"])
def test_a_nan_is_never_compared_in_a_predicate(nan: object, op: str) -> None:
    """PostgreSQL's NaN equals NaN and is greater than every number; Python's ``==`` is
    false and a Decimal NaN's ``<`` raised :class:`decimal.InvalidOperation` (an engine
    error to the manager) in a WHERE evaluated on delta rows, on either side of a column
    comparison, and against a NaN constant in HAVING: refused instead."""
    other = Decimal(5) if type(nan) is Decimal else 5.0
    tests: list[Callable[[], object]] = [
        lambda: Select(Cmp(op, Col(0), Const(Decimal(20)))).test((nan,)),
        lambda: Select(Cmp(op, Col(0), Col(1))).test((other, nan)),
        lambda: Cmp(op, Arith("+", Col(0), Const(1)), Col(1)).eval((nan, other)),
        lambda: Select(Cmp(op, Col(0), Const(nan))).test((other,)),
        lambda: Select(Cmp(op, Col(0), Const(nan))).test((7,)),
    ]
    for test in tests:
        with pytest.raises(NotMaintainable):
            test()


@pytest.mark.parametrize("nan", NANS)
def test_a_having_against_a_nan_constant_is_refused(nan: object) -> None:
    """``count(*) > 'NaN'::numeric`` compared the int count with the NaN right away."""
    agg = Aggregate(group_by=(0,), aggs=(AggSpec("count_star"),), slots=1)
    test = compile_group_test(Cmp(">", Col(1), Const(nan)), 1, ["count_star"])
    assert test is not None
    agg.step(ZSet([((1,), (frozenset({0}),), 1)]))
    with pytest.raises(NotMaintainable):
        test(((1,), agg.groups[(1,)].accs))


@pytest.mark.parametrize("nan", NANS)
@pytest.mark.parametrize("descending", [False, True])
def test_best_values_refuse_a_nan_before_sorting(nan: object, descending: bool) -> None:
    """The values of a min/max state build or refill were sorted before the buffer's check:
    a Decimal NaN raised :class:`decimal.InvalidOperation` there (found: a recapture of a
    top-k over max(v) after NaN was written, counted as an engine error each time)."""
    with pytest.raises(NotMaintainable):
        best_values([(Decimal(1), 2), (nan, 1), (Decimal(3), 1)], descending, None)
    assert best_values([(Decimal(1), 2), (Decimal(4), 1), (Decimal(3), 1)], descending, 2) == (
        [(Decimal(4), 1), (Decimal(3), 1)] if descending else [(Decimal(1), 2), (Decimal(3), 1)],
        False)


@pytest.mark.parametrize("nan", NANS)
def test_min_max_and_top_k_refuse_a_nan(nan: object) -> None:
    """Every way a NaN enters a min/max buffer or a top-k is refused before a comparison:
    one value, a pre-aggregated value change, a refill, a top-k row."""
    for descending in (False, True):
        buf = ValueBuffer(descending, limit=2)
        buf.load([(Decimal(1), 1), (Decimal(2), 1)], False)
        buf.nonnull = 5
        with pytest.raises(NotMaintainable):
            buf.add(nan, 1)
        with pytest.raises(NotMaintainable):
            buf.load([(Decimal(2), 1), (nan, 1)], True)
    agg = Aggregate(group_by=(0,), aggs=(AggSpec("max", 1),), slots=1)
    with pytest.raises(NotMaintainable):
        agg.step_partials([((1,), [(0, 0)], 1, [None])], [((1,), 0, nan, 1)])
    top = TopK([OrderItem(0, descending=True)], k=1)
    top.step(ZSet([((Decimal(3),), (frozenset({0}),), 1)]))
    with pytest.raises(NotMaintainable):
        top.step(ZSet([((nan,), (frozenset({1}),), 1)]))


_EDGES = [("10::numeric ^ 131071 * 9", "10::numeric ^ 131071"),          # 131,072 digits
          ("10::numeric ^ 131071 * 5", "10::numeric ^ 131071 * 5"),      # exactly 10^131072
          ("10::numeric ^ 131071 * 5", "10::numeric ^ 131071 * 4.9"),
          ("-(10::numeric ^ 131071) * 9", "-(10::numeric ^ 131071) * 2"),
          ("1e-8000", "1e-8383"), ("1e-8000", "1e-8384"), ("1.5", "1e-16382")]


@pytest.mark.parametrize(("left", "right"), _EDGES)
@pytest.mark.parametrize("op", ["+", "-", "*"])
def test_results_beyond_numerics_limits_are_refused_where_postgresql_raises_or_rounds(
        admin_dsn: str, left: str, right: str, op: str) -> None:
    """PostgreSQL's numeric holds 131,072 digits before the point (beyond: 22003) and
    rounds a product to 16,383 after it. Python gives PostgreSQL's value and scale where it
    neither raises nor rounds, and refuses (the caller recaptures) where it raises, and
    for every product beyond 16,383 places."""
    import psycopg

    with psycopg.connect(admin_dsn, autocommit=True) as c:
        a, b = c.execute(f"SELECT ({left})::text, ({right})::text").fetchone()  # type: ignore[misc]
        try:
            row = c.execute(f"SELECT (({left}) {op} ({right}))::text").fetchone()
            expected: str | None = None if row is None else row[0]
        except psycopg.errors.NumericValueOutOfRange:
            expected = None
    f = {"+": numeric.add, "-": numeric.subtract, "*": numeric.multiply}[op]
    exact = numeric.EXACT.multiply(Decimal(a), Decimal(b))
    if expected is None or (op == "*" and -exact.as_tuple().exponent > numeric.MAX_SCALE):  # type: ignore[operator]
        with pytest.raises(NotMaintainable):
            f(Decimal(a), Decimal(b))
    else:   # the same value at the same scale (Python prints it otherwise)
        got, want = f(Decimal(a), Decimal(b)), Decimal(expected)
        assert got == want and got.as_tuple().exponent == want.as_tuple().exponent
