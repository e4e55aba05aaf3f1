"""sketches.sql.spark_translate: parameter inlining and the HAVING / ORDER BY translation."""

from __future__ import annotations

from decimal import Decimal

import pytest

from sketches.sql.spark_translate import (
    Bin,
    BoolOp,
    IsNull,
    Lit,
    Neg,
    Not,
    NotTranslatable,
    Ref,
    inline_params,
    translate,
)

NAMES = {"sum(v)": "a0", "count(*)": "a1", "g": "e0", "avg(v)": "a2"}
AVG = frozenset({"avg(v)"})


def literal(value: object) -> str:
    return "NULL" if value is None else f"'{value}'::text" if isinstance(value, str) \
        else str(value)


def test_inline_params() -> None:
    assert inline_params("v > $1 AND t = $2", literal, [5, "x"]) == \
        "v > 5 AND t = CAST('x' AS text)"
    assert inline_params("v > 3", literal, None) == "v > 3"
    with pytest.raises(NotTranslatable, match=r"\$2 is not bound"):
        inline_params("v > $2", literal, [1])


def test_translate_tree() -> None:
    node = translate("NOT (sum(v) + 2 * count(*) >= $1 OR g IS NULL)", NAMES, AVG, [10])
    assert node == Not(BoolOp("or", (
        Bin(">=", Bin("+", Ref("a0"), Bin("*", Lit(2), Ref("a1"))), Lit(10)),
        IsNull(Ref("e0"), False))))
    assert translate("-sum(v) < 1.5", NAMES, AVG, None) == \
        Bin("<", Neg(Ref("a0")), Lit(Decimal("1.5")))


@pytest.mark.parametrize(("text", "params", "message"), [
    ("avg(v) > 3", None, "avg is not compared"),
    ("sum(v) > $1", ["ten"], "parameter \\$1 of type str"),
    ("sum(v) > $2", [1], "\\$2 is not bound"),
    ("g = 'x'", None, "only numbers and booleans"),
    ("sum(v) / 2 > 1", None, "operator /"),
    ("max(v) > 1", None, "not evaluated outside PostgreSQL"),
])
def test_refusals(text: str, params: list[object] | None, message: str) -> None:
    with pytest.raises(NotTranslatable, match=message):
        translate(text, NAMES, AVG, params)
