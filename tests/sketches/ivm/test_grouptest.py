"""HAVING on a group's accumulators (sketches.ivm.ops.grouptest) agrees with HAVING on its
output row, and an average compared with a constant agrees with PostgreSQL — ties and
near-ties of the rounded average included."""

from __future__ import annotations

from decimal import Decimal

import psycopg
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql

from sketches.ivm.errors import NotMaintainable
from sketches.ivm.expr import And, Cmp, Col, Const, Expr, IsNull, Or
from sketches.ivm.ops.accumulators import Accumulator, make_accumulator, pg_numeric_div
from sketches.ivm.ops.grouptest import compile_group_test
from sketches.ivm.ops.select import _compile

OPS = ["=", "<>", "!=", "<", "<=", ">", ">="]
FUNCS = ("count_star", "sum", "avg", "min", "max", "avg")
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


def _outcome(f: object, arg: object) -> object:
    try:
        return ("value", f(arg))  # type: ignore[operator]
    except NotMaintainable:
        return ("not maintainable",)
    except TypeError:
        return ("type error",)
    except ArithmeticError:   # ordering against Decimal NaN
        return ("arithmetic error",)


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
