"""The specialised fast paths of the operators agree with the generic code they replace:
compiled HAVING predicates with ``Expr.eval``, the int path of the avg division with the
Fraction reference, bound order/join key functions with ``order_key`` / ``key_of``."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from sketches.ivm.errors import NotMaintainable
from sketches.ivm.expr import And, Cmp, Col, Const, Expr, Not, Or
from sketches.ivm.ops.accumulators import _pg_numeric_div_fraction, pg_numeric_div
from sketches.ivm.ops.join import key_function, key_of
from sketches.ivm.ops.select import _compile
from sketches.ivm.ops.topk import OrderItem, order_key, order_key_function

SETTINGS = settings(max_examples=300, deadline=None)
values = st.one_of(st.none(), st.integers(-5, 5), st.decimals(-5, 5, places=1),
                   st.floats(-5, 5), st.sampled_from(["a", "b"]), st.booleans())
rows = st.tuples(values, values, values)
consts = st.one_of(st.none(), st.integers(-5, 5), st.decimals(-5, 5, places=1),
                   st.sampled_from(["a"]))
cmps = st.builds(Cmp, st.sampled_from(["=", "<>", "!=", "<", "<=", ">", ">="]),
                 st.builds(Col, st.integers(0, 2)), st.builds(Const, consts))
exprs: st.SearchStrategy[Expr] = st.recursive(
    cmps, lambda sub: st.one_of(
        st.builds(Or, st.lists(sub, min_size=1, max_size=3).map(tuple)),
        st.builds(And, st.lists(sub, min_size=1, max_size=3).map(tuple)),
        st.builds(Not, sub)), max_leaves=6)


def _outcome(f: object, row: tuple[object, ...]) -> object:
    try:
        return ("value", f(row))  # type: ignore[operator]
    except NotMaintainable:
        return ("not maintainable",)
    except TypeError:
        return ("type error",)


@SETTINGS
@given(exprs, rows)
def test_compiled_predicate_is_eval(expr: Expr, row: tuple[object, ...]) -> None:
    assert _outcome(_compile(expr), row) == _outcome(expr.eval, row)


@SETTINGS
@given(st.one_of(st.integers(-10**6, 10**6), st.integers(-10**40, 10**40)),
       st.one_of(st.integers(1, 50), st.integers(1, 10**15)))
def test_int_avg_division(total: int, count: int) -> None:
    fast, slow = pg_numeric_div(total, count), _pg_numeric_div_fraction(total, count)
    assert str(fast) == str(slow)
    assert str(pg_numeric_div(Decimal(total), count)) == str(slow)


order_items = st.builds(OrderItem, st.integers(0, 2), st.booleans(),
                        st.one_of(st.none(), st.booleans()))
order_values = st.one_of(st.none(), st.integers(-5, 5), st.decimals(-5, 5, places=1),
                         st.floats(-5, 5), st.sampled_from(["a", float("nan")]))


@SETTINGS
@given(st.lists(order_items, min_size=1, max_size=2),
       st.tuples(order_values, order_values, order_values))
def test_order_key_function(order: list[OrderItem], row: tuple[object, ...]) -> None:
    key = order_key_function(order)
    try:
        expected: object = order_key(row, order)
    except NotMaintainable:
        expected = NotMaintainable
    try:
        got: object = key(row)
    except NotMaintainable:
        got = NotMaintainable
    assert got == expected


@SETTINGS
@given(st.lists(st.integers(0, 2), min_size=1, max_size=2),
       st.tuples(values, values, values))
def test_join_key_function(cols: list[int], row: tuple[object, ...]) -> None:
    assert key_function(cols)(row) == key_of(row, cols)
