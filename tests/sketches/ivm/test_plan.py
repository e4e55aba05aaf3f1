"""Plan compilation (what is refused, how payloads are laid out) and the SQL-text helpers,
without a database."""

from __future__ import annotations

from decimal import Decimal

import pytest

from sketches.ivm.errors import NotMaintainable
from sketches.ivm.expr import Arith, Cmp, Col, Const
from sketches.ivm.plan import SketchTarget, compile
from sketches.ivm.sqltext import arithmetic, bind_params, parse_expression
from sketches.ranges import RangePartition
from sketches.sql import analyse

PART = RangePartition("public", "r", "g", "integer", (0, 5), ("0", "5"), "{0,5}")


def plan_of(query: str, params: tuple[object, ...] | None = None):  # type: ignore[no-untyped-def]
    return compile(analyse(query), [SketchTarget(0, "g", PART)], params).spec


@pytest.mark.parametrize("query", [
    "SELECT r.g, count(DISTINCT s.b) FROM r JOIN s ON s.rid = r.id GROUP BY r.g",
    "SELECT r.g, sum(s.b) FROM r JOIN s ON s.rid = r.id WHERE r.a < s.b GROUP BY r.g",
    "SELECT r.g, sum(r.a * s.b) FROM r JOIN s ON s.rid = r.id GROUP BY r.g",
    "SELECT r.g, sum(s.b) FROM r, s GROUP BY r.g",
    "SELECT r.g FROM r GROUP BY r.g HAVING abs(sum(r.a)) > 1",
    "SELECT r.g FROM r GROUP BY r.g HAVING sum(r.a) / 2 > 1",
    "SELECT DISTINCT r.g, count(*) FROM r GROUP BY r.g",
    "SELECT r.g, r.a FROM r ORDER BY r.a LIMIT $1",
])
def test_refused(query: str) -> None:
    with pytest.raises(NotMaintainable):
        plan_of(query)


def test_layout_of_join_aggregate() -> None:
    spec = plan_of("SELECT r.g, sum(s.b) FROM r JOIN s ON s.rid = r.id WHERE s.b > $1"
                   " GROUP BY r.g HAVING sum(s.b) >= $2", (3, Decimal("2.5")))
    assert [t.alias for t in spec.tables] == ["r", "s"]
    r, s = spec.tables
    assert r.payload[0] == '"r"."id"' and s.payload[0] == '"s"."rid"'  # join keys first
    assert s.where == ("s.b > 3",)                                     # bound, pushed down
    assert r.slot == 0 and s.slot is None and r.fragment is not None
    assert spec.joins[0].left_key == (0,) and spec.joins[0].right_key == (0,)
    assert spec.kind == "aggregate" and not spec.scalar
    row = spec.group_by[0]
    assert spec.offsets == (0, len(r.payload)) and row < len(r.payload)
    assert spec.having is not None and spec.having.eval((1, Decimal("2.5"))) is True
    assert spec.having.eval((1, 2)) is False and spec.having.eval((1, None)) is None


def test_bind_params_skips_quoted_text() -> None:
    assert bind_params("a = $1 AND b = '$1' AND \"$2\" = $2", (5, "x"), repr) == \
        "a = 5 AND b = '$1' AND \"$2\" = 'x'"
    with pytest.raises(NotMaintainable):
        bind_params("a = $3", (1,), repr)


def test_parse_expression_leaves_and_three_valued_logic() -> None:
    leaves = [("sum(t.v)", Col(1)), ("t.g", Col(0))]
    e = parse_expression("NOT (sum(t.v) > 10 OR t.g IS NULL) AND -sum(t.v) * 2 < 3::numeric",
                         leaves)
    assert e.eval((1, 5)) is True
    assert e.eval((None, 5)) is False
    assert e.eval((1, None)) is None
    assert parse_expression("$1", [], (Decimal("1.5"),)) == Const(Decimal("1.5"))
    assert parse_expression("sum(t.v) >= -3", leaves) == Cmp(">=", Col(1), Const(-3))
    long = "1234567890.12345678901234567890123"       # more digits than the decimal context
    assert parse_expression(f"- -{long}", []) == Const(Decimal(long))
    assert parse_expression(f"-{long}", []) == Const(Decimal(f"-{long}"))
    assert parse_expression("-sum(t.v)", leaves) == Arith("-", Const(0), Col(1))
    for bad in ("lower(t.g) = 'a'", "sum(t.v) BETWEEN 1 AND 2", "sum(t.v) > 1 + $$x$$"):
        with pytest.raises(NotMaintainable):
            parse_expression(bad, leaves)
    with pytest.raises(NotMaintainable):  # text ordering depends on the collation
        parse_expression("t.g > 'm'", leaves).eval(("z", 1))
    with pytest.raises(NotMaintainable, match="quoted literal"):  # '5' is 5 in PostgreSQL
        parse_expression("sum(t.v) <> '5'", leaves).eval(("z", 5))
    with pytest.raises(NotMaintainable, match="quoted literal"):
        parse_expression("sum(t.v) + '5' > 3", leaves).eval(("z", 5))


def test_arithmetic_keeps_postgresqls_ranges() -> None:
    """Each arithmetic node carries its text (typed by PostgreSQL at compile time) and, once
    typed, refuses a result its type cannot hold, as PostgreSQL fails the query."""
    leaves = [("max(t.v)", Col(1)), ("t.g", Col(0))]
    text = "(max(t.v) + 1) * 1000 < -t.g"
    untyped = parse_expression(text, leaves)
    assert [a.sql for a in arithmetic(untyped)] == [
        "(max(t.v) + 1) * 1000", "max(t.v) + 1", "-t.g"]
    assert untyped.eval((0, 3_000_000)) is False   # untyped: Python's unbounded integers
    typed = parse_expression(text, leaves, types={"(max(t.v) + 1) * 1000": 23,
                                                  "max(t.v) + 1": 23, "-t.g": 23})
    assert typed.eval((0, 2_000_000)) is False
    with pytest.raises(NotMaintainable, match="integer out of range"):
        typed.eval((0, 3_000_000))
    with pytest.raises(NotMaintainable, match="integer out of range"):
        typed.eval((-(1 << 31), 1))                 # -(-2147483648) is no integer
    assert parse_expression("max(t.v) * 3", leaves, types={"max(t.v) * 3": 20}).eval(
        (0, 1 << 61)) == 3 << 61
    floats = parse_expression("max(t.v) * 1e300", leaves, types={"max(t.v) * 1e300": 701})
    assert floats.eval((0, 2.0)) == 2e300
    for v in (1e10, 1e-200):                        # overflow; underflow to zero
        with pytest.raises(NotMaintainable, match="float8 out of range"):
            parse_expression("max(t.v) * 1e-300" if v < 1 else "max(t.v) * 1e300", leaves,
                             types={"max(t.v) * 1e-300": 701, "max(t.v) * 1e300": 701}
                             ).eval((0, v))
