"""sketches.ivm.thresholds: min/max in HAVING as counts. The rewrite on expression trees, and
against PostgreSQL: on generated data (NULLs, NaN, infinities) and generated HAVING trees the
groups whose counts pass are exactly the groups PostgreSQL's HAVING keeps, at the build and
after random changes."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pg_extensions
from sketches.ivm.errors import NotMaintainable
from sketches.ivm.expr import And, Arith, Cmp, Col, Const, Expr, Not, Or
from sketches.ivm.plan import Options, SketchTarget, compile
from sketches.ivm.sqltext import arithmetic
from sketches.ivm.thresholds import Counter, rewrite
from sketches.ranges import RangePartition
from sketches.sql import analyse

Conn = psycopg.Connection[Any]
W = 1   # one group column: aggregates start at column 1


def agg(i: int) -> Col:
    return Col(W + i)


@pytest.mark.parametrize(("func", "op", "expected"), [
    ("max", ">=", [Counter(0, ">=", 5)]), ("max", ">", [Counter(0, ">", 5)]),
    ("min", "<=", [Counter(0, "<=", 5)]), ("min", "<", [Counter(0, "<", 5)]),
    ("max", "<=", [Counter(0), Counter(0, ">", 5)]),
    ("max", "<", [Counter(0), Counter(0, ">=", 5)]),
    ("min", ">=", [Counter(0), Counter(0, "<", 5)]),
    ("min", ">", [Counter(0), Counter(0, "<=", 5)]),
])
def test_each_comparison_becomes_its_counts(func: str, op: str, expected: list[Counter]) -> None:
    rw = rewrite(Cmp(op, agg(0), Const(5)), W, [func])
    assert rw is not None and rw.kept == () and list(rw.counters) == expected
    if len(expected) == 1:
        assert rw.having == Cmp(">", agg(0), Const(0))
    else:
        assert rw.having == And((Cmp(">", agg(0), Const(0)), Cmp("=", agg(1), Const(0))))
    flipped = {">=": "<=", ">": "<", "<=": ">=", "<": ">"}[op]
    assert rewrite(Cmp(flipped, Const(5), agg(0)), W, [func]) == rw


def test_other_aggregates_keep_their_columns_and_unread_ones_go_but_sums() -> None:
    """An unread count, min or max goes; an unread sum or avg stays: PostgreSQL raises when
    one overflows numeric, in any group (``thresholds`` module docstring)."""
    having = Or((Cmp(">", agg(2), Const(1)), Cmp(">=", agg(1), Const(Decimal("2.5"))),
                 Cmp("=", Col(0), Const(3))))
    rw = rewrite(having, W, ["sum", "max", "count", "avg", "min", "count"])
    assert rw is not None and rw.kept == (0, 2, 3)
    assert rw.counters == (Counter(1, ">=", Decimal("2.5")),)
    assert rw.having == Or((Cmp(">", agg(1), Const(1)), Cmp(">", agg(3), Const(0)),
                            Cmp("=", Col(0), Const(3))))


def test_kept_arithmetic_keeps_its_type() -> None:
    """Found: the rewrite rebuilt ``max(a) * 10000000`` without its text and result type, so it
    no longer refused an int4 overflow; ``300 * 10^7 < 0`` was simply false, the group went
    missing, and the client got rows where PostgreSQL raises ``integer out of range``."""
    product = Arith("*", agg(1), Const(10_000_000), "max(a) * 10000000", 23)
    rw = rewrite(Or((Cmp("<", agg(0), Const(5)), Cmp("<", product, Const(0)))), W,
                 ["min", "max", "count_star"])
    assert rw is not None and rw.kept == (1,)
    moved = Arith("*", agg(0), Const(10_000_000), "max(a) * 10000000", 23)
    assert rw.having == Or((Cmp(">", agg(1), Const(0)), Cmp("<", moved, Const(0))))
    assert [a.result_type for a in arithmetic(rw.having)] == [23]
    with pytest.raises(NotMaintainable, match="integer out of range"):
        rw.having.eval((39, 300, 0))


@pytest.mark.parametrize("having", [
    Not(Cmp(">=", agg(0), Const(5))),                      # under NOT: NULL ≠ FALSE there
    Cmp("=", agg(0), Const(5)),                            # equality: not one count
    Cmp(">=", agg(0), Const(5.0)),                         # float constant
    Cmp(">=", agg(0), Const(None)),
    Cmp(">=", agg(0), Const("x")),
    Cmp(">=", agg(0), Const(Decimal("NaN"))),
    Or((Cmp(">=", agg(0), Const(5)), Cmp("<", agg(0), agg(1)))),   # also read elsewhere
])
def test_min_max_read_otherwise_keep_their_buffer(having: Expr) -> None:
    rw = rewrite(having, W, ["max", "count"])
    assert rw is None or 0 in rw.kept


# ---- against PostgreSQL ------------------------------------------------------------------

G_PART = RangePartition("public", "th", "g", "integer", (0, 2, 4, 6), ("0", "2", "4", "6"),
                        "{0,2,4,6}")
COLUMNS = {"i": "int", "n": "numeric", "f": "float8"}
VALUES = {   # mostly the constants themselves: ties decide between < and <=
    "i": st.one_of(st.none(), st.sampled_from([-1, 0, 2, 5, 7]), st.integers(-3, 9)),
    "n": st.one_of(st.none(), st.sampled_from([Decimal(v) for v in ("-1", "0", "2", "4.25", "7")]),
                   st.decimals(-3, 9, places=1, allow_nan=False)),
    "f": st.one_of(st.none(), st.sampled_from([float("nan"), float("inf"), float("-inf"),
                                              -1.0, 0.0, 2.0, 4.25, 5.0, 7.0, -1.5])),
}
CONSTS = st.sampled_from(["-1", "0", "2", "4.25", "5", "7"])


@pytest.fixture(scope="module")
def db(db_dsn: str) -> str:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        pg_extensions.install(c)
        c.execute("CREATE TABLE th (id int PRIMARY KEY, g int, i int, n numeric, f float8)")
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("SELECT imp.track_table('th'::regclass)")
    return db_dsn


@st.composite
def leaves(draw: st.DrawFn) -> str:
    func = draw(st.sampled_from(["min", "max"]))
    col = draw(st.sampled_from(sorted(COLUMNS)))
    op = draw(st.sampled_from(["<", "<=", ">", ">="]))
    const = draw(CONSTS)
    if draw(st.booleans()):
        return f"{func}(t.{col}) {op} {const}"
    return f"{const} {op} {func}(t.{col})"


@st.composite
def havings(draw: st.DrawFn, depth: int = 2) -> str:
    """Half of them a single leaf (where a wrong boundary shows most often), the others AND/OR
    trees of leaves and ``count(*) > 2``."""
    if depth == 0 or draw(st.booleans()):
        return draw(st.one_of(leaves(), leaves(), st.just("count(*) > 2")))
    parts = draw(st.lists(havings(depth - 1), min_size=2, max_size=3))
    return "(" + draw(st.sampled_from([" AND ", " OR "])).join(parts) + ")"


rows = st.lists(st.tuples(st.integers(0, 7), VALUES["i"], VALUES["n"], VALUES["f"]),
                max_size=30)


def _fill(conn: Conn, data: list[tuple[Any, ...]], first_id: int) -> None:
    for k, (g, i, n, f) in enumerate(data):
        conn.execute("INSERT INTO th VALUES (%s, %s, %s, %s, %s)", (first_id + k, g, i, n, f))


def _exact(conn: Conn, having: str) -> frozenset[int]:
    frag = G_PART.fragment_sql(psycopg.sql.Identifier("x", "g")).as_string(conn)
    got = conn.execute(f"SELECT DISTINCT {frag} FROM th x WHERE x.g IN"
                       f" (SELECT t.g FROM th t GROUP BY t.g HAVING {having})").fetchall()
    return frozenset(int(r[0]) for r in got)


def _snapshot(dsn: str) -> Conn:
    c = psycopg.connect(dsn)
    c.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    return c


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(having=havings(), before=rows, added=rows, removed=st.lists(st.integers(0, 24)),
       preaggregate=st.booleans())
def test_counts_keep_the_groups_postgres_keeps(db: str, having: str, before: list[Any],
                                                added: list[Any], removed: list[int],
                                                preaggregate: bool) -> None:
    query = f"SELECT t.g, count(*) FROM th t GROUP BY t.g HAVING {having}"
    options = Options(preaggregate=preaggregate)
    pipe = compile(analyse(query), [SketchTarget(0, "g", G_PART)], None, options)
    assert not {a.func for a in pipe.spec.aggs} & {"min", "max"}, pipe.spec.aggs
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("DELETE FROM th")
        _fill(c, before, 0)
    with _snapshot(db) as c:
        pipe.build_state(c)
        assert pipe.sketch() == (_exact(c, having),), "at the build"
        c.commit()
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("DELETE FROM th WHERE id = ANY(%s)", (removed,))
        _fill(c, added, 100)
        c.execute("UPDATE th SET f = i WHERE id % 3 = 0")
    with _snapshot(db) as c:
        pipe.maintain(c)
        assert pipe.sketch() == (_exact(c, having),), "after the changes"
        c.commit()


BOUNDARY_ROWS = [(0, 5, None, 5.0), (1, 4, None, 4.0), (2, 6, None, 6.0), (3, None, None, None),
                 (4, 5, None, 4.0), (4, 4, None, float("nan")), (5, None, None, 5.0),
                 (5, 6, None, float("-inf")), (6, 5, None, float("inf")), (6, 6, None, 5.0)]
"""Groups whose values tie with 5, lie below or above it, are all NULL, NaN or infinite."""


@pytest.mark.parametrize("col", ["i", "f"])
@pytest.mark.parametrize("op", ["<", "<=", ">", ">="])
@pytest.mark.parametrize("func", ["min", "max"])
def test_every_form_at_its_boundary(db: str, func: str, op: str, col: str) -> None:
    for having in (f"{func}(t.{col}) {op} 5", f"5 {op} {func}(t.{col})"):
        test_counts_keep_the_groups_postgres_keeps.hypothesis.inner_test(  # type: ignore[attr-defined]
            db, having, BOUNDARY_ROWS, [(7, 5, None, 5.0)], [0], True)
