"""The specialised fast paths of the operators agree with the generic code they replace:
compiled HAVING predicates with ``Expr.eval``, HAVING on a group's accumulators with HAVING on
its output row (and an average compared with a constant with PostgreSQL), the int path of the
avg division with the Fraction reference, bound order/join key functions with ``order_key`` /
``key_of``."""

from __future__ import annotations

from decimal import Decimal

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql

from sketches.ivm.errors import NotMaintainable
from sketches.ivm.expr import And, Arith, Cmp, Col, Const, Expr, IsNull, Not, Or
from sketches.ivm.ops.accumulators import (
    Accumulator,
    _pg_numeric_div_fraction,
    make_accumulator,
    pg_numeric_div,
)
from sketches.ivm.ops.grouptest import compile_group_test
from sketches.ivm.ops.join import key_function, key_of
from sketches.ivm.ops.select import _compile
from sketches.ivm.ops.topk import OrderItem, order_key, order_key_function
from sketches.typeoids import INT2

SETTINGS = settings(max_examples=300, deadline=None)
values = st.one_of(st.none(), st.integers(-5, 5), st.decimals(-5, 5, places=1),
                   st.floats(-5, 5), st.sampled_from(["a", "b"]), st.booleans())
rows = st.tuples(values, values, values)
consts = st.one_of(st.none(), st.integers(-5, 5), st.decimals(-5, 5, places=1),
                   st.sampled_from(["a"]))
OPS = st.sampled_from(["=", "<>", "!=", "<", "<=", ">", ">="])
cmps = st.one_of(
    st.builds(Cmp, OPS, st.builds(Col, st.integers(0, 2)), st.builds(Const, consts)),
    st.builds(Cmp, OPS, st.builds(Arith, st.sampled_from(["+", "*"]),
                                  st.builds(Col, st.integers(0, 2)), st.builds(Const, consts),
                                  result_type=st.just(INT2)), st.builds(Const, consts)))
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
    except ArithmeticError:   # ordering against Decimal NaN
        return ("arithmetic error",)


@SETTINGS
@given(exprs, rows)
def test_compiled_predicate_is_eval(expr: Expr, row: tuple[object, ...]) -> None:
    assert _outcome(_compile(expr), row) == _outcome(expr.eval, row)


@pytest.mark.parametrize("is_or", [False, True])
def test_a_connective_computing_arithmetic_evaluates_every_argument(is_or: bool) -> None:
    """Its overflow raises although an argument before it decides: PostgreSQL's order is
    not the written one (``test_raised_errors``). One without arithmetic still stops at the
    deciding argument (a text value beside a number is not compared)."""
    decided = Cmp("<" if is_or else ">", Col(0), Const(5))
    overflow = Cmp(">", Arith("*", Col(1), Const(200), result_type=INT2), Const(0))
    plain = Cmp(">", Col(2), Const(1))
    build = Or if is_or else And
    for expr in (build((decided, overflow)), build((decided, build((plain, overflow))))):
        for test in (expr.eval, _compile(expr)):
            with pytest.raises(NotMaintainable):
                test((1, 200, 0))
            assert test((1, 1, 0)) is is_or
    for test in (build((decided, plain)).eval, _compile(build((decided, plain)))):
        assert test((1, 200, "a")) is is_or


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


# -- HAVING on a group's accumulators (sketches.ivm.ops.grouptest) vs on its output row, and
# an average compared with a constant vs PostgreSQL: ties and near-ties of the rounding included

OPS = ["=", "<>", "!=", "<", "<=", ">", ">="]
FUNCS = ("count_star", "sum", "avg", "min", "max", "avg", "count")
WIDTH = 1
ints = st.lists(st.integers(-10**6, 10**6), min_size=1, max_size=8)


def _avg_constants(values: list[int]) -> st.SearchStrategy[object]:
    """The rounded average itself, numbers a few units of its last digit or of a power of
    ten away, and arbitrary ones."""
    avg = pg_numeric_div(sum(values), len(values))
    exp = avg.as_tuple().exponent
    assert isinstance(exp, int)
    return st.one_of(
        st.just(avg),
        st.builds(lambda k, s: avg + s * Decimal(1).scaleb(exp + k),
                  st.integers(0, 3), st.integers(-2, 2)),
        st.builds(lambda k, s: avg + s * Decimal(1).scaleb(-k), st.integers(0, 25),
                  st.sampled_from([-1, 1])),
        st.builds(lambda k: avg.quantize(Decimal(1).scaleb(-k)), st.integers(0, 18)),
        st.integers(-10**6, 10**6), st.decimals(-10**6, 10**6, places=4))


def _group(values: list[int | None]) -> list[Accumulator]:
    accs = [make_accumulator(f, None) for f in FUNCS]
    for v in values:
        for acc in accs:
            acc.add(1 if acc is accs[0] else v, 1)
    return accs


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_group_test_is_the_row_test(data: st.DataObject) -> None:
    """Any AND/OR of comparisons of a key or aggregate with a constant: same outcome (value or
    error) on the accumulators as on the output row."""
    values = data.draw(st.lists(st.one_of(st.none(), st.integers(-50, 50)), max_size=6))
    accs = _group(values)
    key = (data.draw(st.one_of(st.none(), st.integers(-3, 3), st.sampled_from(["a", "b"]))),)
    row = key + tuple(a.result() for a in accs)
    ints_only = [v for v in values if v is not None]
    consts = st.one_of(st.integers(-50, 50), st.decimals(-50, 50, places=2),
                       st.floats(-50, 50), st.sampled_from(["a", Decimal("NaN")]),
                       _avg_constants(ints_only) if ints_only else st.integers(0, 1))
    leaves = st.builds(Cmp, st.sampled_from(OPS), st.builds(Col, st.integers(0, len(row) - 1)),
                       st.builds(Const, consts))
    expr: Expr = data.draw(st.recursive(leaves, lambda sub: st.one_of(
        st.builds(Or, st.lists(sub, min_size=1, max_size=3).map(tuple)),
        st.builds(And, st.lists(sub, min_size=1, max_size=3).map(tuple))), max_leaves=5))
    on_group = compile_group_test(expr, WIDTH, FUNCS)
    assert on_group is not None or "a" in repr(expr)          # a text constant: row test only
    if on_group is not None:
        assert _outcome(on_group, (key, accs)) == _outcome(_compile(expr), row)


def test_other_predicates_stay_on_rows() -> None:
    """NULL tests, arithmetic and constants on the left are left to the row test."""
    with_null_test = Or((Cmp(">", Col(1), Const(1)), IsNull(Col(2))))
    assert compile_group_test(with_null_test, WIDTH, FUNCS) is None
    assert compile_group_test(Cmp(">", Const(1), Col(1)), WIDTH, FUNCS) is None
    assert compile_group_test(Cmp(">", Col(1), Const(None)), WIDTH, FUNCS) is None


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_avg_comparison_is_the_rounded_average_comparison(data: st.DataObject) -> None:
    values = data.draw(ints)
    const = data.draw(_avg_constants(values))
    op = data.draw(st.sampled_from(OPS))
    accs = _group(list(values))
    test = compile_group_test(Cmp(op, Col(WIDTH + 2), Const(const)), WIDTH, FUNCS)
    assert test is not None
    assert test(((0,), accs)) == _compile(Cmp(op, Col(0), Const(const)))((accs[2].result(),))


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_avg_comparison_matches_postgres(admin_dsn: str, data: st.DataObject) -> None:
    """The oracle: PostgreSQL's own ``avg(int) op numeric`` on the same values."""
    values = data.draw(ints)
    consts = [data.draw(_avg_constants(values)) for _ in range(4)]
    accs = _group(list(values))
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        for const in consts:
            for op in ("=", "<>", "<", "<=", ">", ">="):
                row = c.execute(sql.SQL("SELECT avg(x) {} %s::numeric FROM unnest(%s::int[]) AS x")
                                .format(sql.SQL(op)), (Decimal(const), values)).fetchone()
                test = compile_group_test(Cmp(op, Col(WIDTH + 2), Const(const)), WIDTH, FUNCS)
                assert test is not None and row is not None
                assert test(((0,), accs)) is row[0], (values, op, const)


# -- a float8 against an integer or numeric compares in float8, as in PostgreSQL

doubles = st.floats(-1e6, 1e6, allow_nan=False).filter(lambda f: f != 0) | st.sampled_from(
    [1 / 3, 0.1, 2.0 ** 53, -2.5])


def _near(f: float) -> st.SearchStrategy[int | Decimal]:
    """Numbers at, or within a hair of, the double ``f``: its exact value, its rounding to 20
    significant digits, and integers around it."""
    exact = Decimal(f)
    return st.one_of(st.just(exact), st.just(Decimal(f"{f:.20g}")),
                     st.builds(lambda k: exact + Decimal(k).scaleb(-30), st.integers(-5, 5)),
                     st.builds(lambda k: int(f) + k, st.integers(-1, 1)))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_float8_comparisons_match_postgres(admin_dsn: str, data: st.DataObject) -> None:
    f = data.draw(doubles)
    values = [data.draw(_near(f)) for _ in range(3)]
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        for v in values:
            kind = "int8" if type(v) is int else "numeric"
            for op in ("=", "<>", "<", "<=", ">", ">="):
                row = c.execute(sql.SQL("SELECT %s::{k} {op} %s::float8, %s::float8 {op} %s::{k}")
                                .format(k=sql.SQL(kind), op=sql.SQL(op)),
                                (v, f, f, v)).fetchone()
                assert row is not None
                assert _compile(Cmp(op, Col(0), Const(f)))((v,)) is row[0], (v, op, f)
                assert Cmp(op, Col(0), Const(f)).eval((v,)) is row[0], (v, op, f)
                assert _compile(Cmp(op, Col(0), Const(v)))((f,)) is row[1], (f, op, v)
                assert Cmp(op, Col(0), Col(1)).eval((f, v)) is row[1], (f, op, v)
