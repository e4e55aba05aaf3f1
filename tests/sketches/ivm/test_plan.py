"""Plan compilation (what is refused, how payloads are laid out) and the SQL-text helpers,
without a database."""

from __future__ import annotations

from decimal import Decimal

import pytest

from sketches.ivm.errors import NotMaintainable
from sketches.ivm.expr import Arith, Cmp, Col, Const
from sketches.ivm.plan import SketchTarget, compile
from sketches.ivm.sqltext import bind_params, parse_expression
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
