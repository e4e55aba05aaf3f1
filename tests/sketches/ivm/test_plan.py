"""Plan compilation (what is refused, how payloads are laid out) and the SQL-text helpers,
without a database."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from sketches.ivm.errors import NotMaintainable
from sketches.ivm.expr import And, Arith, Cmp, Col, Const, Expr, IsNull, Not, Or
from sketches.ivm.ops.select import value_vs_constant
from sketches.ivm.plan import SketchTarget, compile
from sketches.ivm.sqltext import arithmetic, bind_params, param_literal, parse_expression
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
    assert s.where == ("s.b > '3'::int2",)    # bound as psycopg binds 3, pushed down
    assert r.slot == 0 and s.slot is None and r.fragment is not None
    assert spec.joins[0].left_key == (0,) and spec.joins[0].right_key == (0,)
    assert spec.kind == "aggregate" and not spec.scalar
    row = spec.group_by[0]
    assert spec.offsets == (0, len(r.payload)) and row < len(r.payload)
    assert spec.having is not None and spec.having.eval((1, Decimal("2.5"))) is True
    assert spec.having.eval((1, 2)) is False and spec.having.eval((1, None)) is None


def test_the_tables_schemas_name_the_sql_but_leave_the_fingerprint() -> None:
    """The state build and the delta reads name each table in the schema the sketch
    resolved it to (``source``); the plan's fingerprint keeps the table as written, so a
    state persisted before the schemas were pinned (or by a proxy that does not pin them)
    still loads (found by a helper's upgrade search: every persisted state was rebuilt)."""
    query = ("SELECT r.g, sum(s.b) FROM r JOIN other.s ON s.rid = r.id"
             " GROUP BY r.g HAVING sum(s.b) > 3")
    plain = compile(analyse(query), [SketchTarget(0, "g", PART)], None).spec
    pinned_analysis = analyse(query).with_schemas([(0, "r", "Odd Schema"), (0, "s", "x")])
    pinned = compile(pinned_analysis, [SketchTarget(0, "g", PART)], None).spec
    assert [t.source for t in pinned.tables] == ['"Odd Schema"."r"', '"other"."s"']
    assert [t.relation for t in pinned.tables] == ['"r"', '"other"."s"']
    assert [t.source for t in plain.tables] == ['"r"', '"other"."s"']
    assert pinned.fingerprint() == plain.fingerprint()


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


def test_numeric_values_python_cannot_follow_are_refused() -> None:
    """Cases where Python's numeric arithmetic parts from PostgreSQL's: a numeric beyond float8's
    range cast to float8 is an error in PostgreSQL (Python's ``float`` made it an infinity);
    ``Infinity × 0`` and ``Infinity − Infinity`` are NaN there (Python's Decimal raised its own
    InvalidOperation). Each is refused, so the sketch recaptures."""
    n, f = Col(0), Col(1)      # max(n) over numeric, max(f) over float8
    big, inf = Decimal("1e400"), Decimal("Infinity")
    for expr, row in [(Cmp(">", f, n), (big, 1.0)), (Cmp("<", n, Const(1e300)), (big, 0.0)),
                      (Cmp("<", Arith("+", f, n), Const(100)), (big, 1.0)),
                      (Cmp(">", Arith("*", n, Const(0)), Const(5)), (inf, 0.0)),
                      (Cmp(">", Arith("-", n, n), Const(5)), (inf, 0.0))]:
        with pytest.raises(NotMaintainable):
            expr.eval(row)
    assert Cmp(">", f, n).eval((Decimal("1e300"), 1.0)) is False
    assert Cmp(">", f, n).eval((-inf, 1.0)) is True


def test_date_arithmetic_is_refused() -> None:
    """``max(d) - min(d)`` over dates is an integer of days in PostgreSQL, a timedelta in
    Python (found: its range check raised TypeError, an engine error, and ``= 0`` would be
    false for equal dates). Refused: the sketch recaptures."""
    days = Arith("-", Col(0), Col(1), "max(t.d) - min(t.d)", 23)
    with pytest.raises(NotMaintainable, match="not evaluated in Python"):
        Cmp("=", days, Const(0)).eval((dt.date(2024, 1, 2), dt.date(2024, 1, 2)))


def test_an_integer_cast_of_a_fraction_is_refused() -> None:
    """PostgreSQL rounds ``7.5::int`` to 8; ``int('7.5')`` raised ValueError, an engine error
    (a helper's note). Refused; an integral text is still cast."""
    leaves = [("sum(t.v)", Col(0))]
    with pytest.raises(NotMaintainable, match="not evaluated in Python"):
        parse_expression("sum(t.v) > 7.5::int", leaves)
    assert parse_expression("sum(t.v) > '7'::int2", leaves) == Cmp(">", Col(0), Const(7))


@pytest.mark.parametrize(("value", "literal"), [
    (2, "'2'::int2"), (-32768, "'-32768'::int2"), (32768, "'32768'::int4"),
    (-(1 << 31) - 1, "'-2147483649'::int8"), (1 << 63, f"'{1 << 63}'::numeric"),
    (2.0, "'2.0'::float8"), (Decimal("2"), "'2'::numeric"),
])
def test_a_parameter_is_inlined_with_the_type_psycopg_binds(value: object,
                                                            literal: str) -> None:
    """An inlined parameter means what the bound one means in the capture (psycopg's types:
    the narrowest integer type that holds an int)."""
    assert param_literal(value) == literal


@pytest.mark.parametrize(("text", "expected"), [
    # found: the leaf t.a + 1 read at the start of t.a + 1 * -1, as (t.a + 1) * -1
    ("t.a + 1 * -1", Arith("+", Col(0), Arith("*", Const(1), Const(-1)))),
    ("3 - t.a + 1", Arith("+", Arith("-", Const(3), Col(0)), Const(1))),
    ("- t.a + 1", Arith("+", Arith("-", Const(0), Col(0)), Const(1))),
    ("2 * t.a + 1", Arith("+", Arith("*", Const(2), Col(0)), Const(1))),
    ("t.a + 1 - 2", Arith("-", Col(1), Const(2))),            # left-associative: a leaf
    ("(t.a + 1) * 2", Arith("*", Col(1), Const(2))),
    ("NOT t.a + 1 > 3", Not(Cmp(">", Col(1), Const(3)))),
    ("t.a + 1 IS NULL", IsNull(Col(1))),
])
def test_a_leaf_is_read_only_where_it_is_a_whole_operand(text: str, expected: Expr) -> None:
    """A GROUP BY expression stands for its column only where PostgreSQL's precedence makes
    it a whole operand; elsewhere its parts are read (here from the key ``t.a``)."""
    leaves = [("count(*)", Col(2)), ("t.a", Col(0)), ("t.a + 1", Col(1))]
    assert parse_expression(text, leaves) == expected


def test_a_leaf_that_is_no_whole_operand_is_refused_without_its_parts() -> None:
    """Boolean GROUP BY expressions: ``NOT a AND b`` is ``(NOT a) AND b``, never the leaf
    ``a AND b`` negated; without a leaf for ``a`` it is refused. A column of another table
    (``s.a``) is no leaf ``a``."""
    leaves = [("t.a AND t.b", Col(0)), ("a = 1", Col(1))]
    assert parse_expression("NOT t.a AND t.b OR a = 1",
                            [*leaves, ("t.a", Col(2)), ("t.b", Col(3))]) == Or(
        (And((Not(Col(2)), Col(3))), Col(1)))
    assert parse_expression("t.a AND t.b OR NOT a = 1", leaves) == Or((Col(0), Not(Col(1))))
    for bad in ("NOT t.a AND t.b", "x AND t.a AND t.b", "s.a = 1"):
        with pytest.raises(NotMaintainable):
            parse_expression(bad, leaves)


@pytest.mark.parametrize(("key", "const"), [
    (dt.date(2020, 1, 5), dt.datetime(2020, 1, 5)),
    (dt.datetime(2020, 1, 5), dt.date(2020, 1, 5)),
    (dt.datetime(2020, 1, 5, tzinfo=dt.UTC), dt.datetime(2020, 1, 5)),
    (dt.time(10), dt.time(10, tzinfo=dt.UTC)),
])
def test_datetimes_of_two_kinds_are_not_compared(key: object, const: object) -> None:
    """PostgreSQL casts one side (a date to a timestamp, a timestamp to timestamptz, a time
    to timetz); Python's ``==`` is false (found: 0 rows instead of 1), so both the
    expression and the compiled comparison refuse; values of one kind compare."""
    for op in ("=", "<>", "<"):
        with pytest.raises(NotMaintainable, match="casts one side"):
            Cmp(op, Col(0), Const(const)).eval((key,))
        with pytest.raises(NotMaintainable, match="casts one side"):
            value_vs_constant(op, const)(key)
    assert value_vs_constant("=", const)(const) is True
    assert value_vs_constant("=", const)(None) is None
    assert Cmp("<>", Col(0), Const(key)).eval((key,)) is False
