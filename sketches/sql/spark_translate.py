"""Expressions of an analysed query in a form another engine evaluates (issue 5).

The Spark backend (``sketches.backends.plan`` / ``spark``) runs the part of a query whose
semantics it reproduces exactly; this module is the pglast side of that split (only
``sketches.sql`` imports pglast):

* :func:`inline_params` — a PostgreSQL expression with every ``$n`` replaced by the literal
  of its bound value (printed by the caller, e.g. with psycopg), so a pushed-down query means
  the same without parameters;
* :func:`translate` — HAVING or an ORDER BY key of an aggregate query as a tiny, engine-neutral
  expression tree (:data:`Node`): comparisons, ``+ - *``, unary minus, AND/OR/NOT and IS
  [NOT] NULL over named aggregates / group keys and numeric or boolean constants. Anything
  else raises :class:`NotTranslatable` (the caller runs the job in PostgreSQL instead).

>>> translate("sum(v) > 10 AND g IS NOT NULL", {"sum(v)": "a0", "g": "e0"}, frozenset(), None)
BoolOp(op='and', args=(Bin(op='>', left=Ref(name='a0'), right=Lit(value=10)), \
IsNull(arg=Ref(name='e0'), negated=True)))
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pglast import ast
from pglast.enums import A_Expr_Kind, BoolExprType, NullTestType

from sketches.errors import SketchError, UnsupportedQuery
from sketches.sql.parse import parse_select, to_sql


class NotTranslatable(SketchError):
    """The expression cannot be evaluated outside PostgreSQL with PostgreSQL's semantics."""


@dataclass(frozen=True, slots=True)
class Ref:
    """A column of the engine's frame (an output of a read, a group key or an aggregate)."""

    name: str


@dataclass(frozen=True, slots=True)
class Lit:
    """A constant; ``pg_type`` ``"int8"`` marks an integer PostgreSQL types bigint (the
    engine must not narrow it to a 32-bit integer, e.g. ``-2147483648``)."""

    value: Any
    pg_type: str | None = None


@dataclass(frozen=True, slots=True)
class Bin:
    op: str  # = <> < <= > >= + - *
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Neg:
    """Unary minus, in the operand's own type: PostgreSQL's ``-x`` on a smallint fails for
    -32768 (``int2um``), where ``0 - x`` is an int subtraction that succeeds. (Found: ``HAVING
    -min(s) < 0`` written as ``0 - min(s)`` hid the query's 'smallint out of range'.)"""

    arg: Node


@dataclass(frozen=True, slots=True)
class BoolOp:
    op: str  # and | or
    args: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Not:
    arg: Node


@dataclass(frozen=True, slots=True)
class IsNull:
    arg: Node
    negated: bool


Node = Ref | Lit | Bin | Neg | BoolOp | Not | IsNull

COMPARISONS = frozenset({"=", "<>", "!=", "<", "<=", ">", ">="})
ARITHMETIC = frozenset({"+", "-", "*"})

Literal = Callable[[object], str]
"""Prints a Python value as a PostgreSQL literal (e.g. ``psycopg.sql.Literal(v).as_string``)."""


# ---------------------------------------------------------------- parameters


def inline_params(text: str, literal: Literal, params: Sequence[object] | None) -> str:
    """``text`` (a PostgreSQL expression) with every ``$n`` replaced by ``literal(params[n-1])``
    — the same value, so the expression means the same without parameters."""
    if "$" not in text:
        return text
    node: Any = parse_select("SELECT " + text).targetList[0].val  # type: ignore[index]
    _replace_params(node, literal, params)
    return to_sql(node)


def _param_node(number: Any, literal: Literal, params: Sequence[object] | None) -> ast.Node:
    if params is None or not 1 <= number <= len(params):
        raise NotTranslatable(f"parameter ${number} is not bound")
    text = literal(params[number - 1])
    node: ast.Node = parse_select("SELECT " + text).targetList[0].val  # type: ignore[index]
    return node


def _replace_params(node: Any, literal: Literal, params: Sequence[object] | None) -> None:
    for attr in list(node):
        value = getattr(node, attr, None)
        if isinstance(value, ast.ParamRef):
            setattr(node, attr, _param_node(value.number, literal, params))
        elif isinstance(value, ast.Node):
            _replace_params(value, literal, params)
        elif isinstance(value, tuple):
            items = []
            for item in value:
                if isinstance(item, ast.ParamRef):
                    items.append(_param_node(item.number, literal, params))
                else:
                    if isinstance(item, ast.Node):
                        _replace_params(item, literal, params)
                    items.append(item)
            setattr(node, attr, tuple(items))


# ---------------------------------------------------------------- HAVING / ORDER BY


def translate(text: str, names: dict[str, str], avg: frozenset[str],
              params: Sequence[object] | None) -> Node:
    """``text`` (HAVING or an ORDER BY key of an aggregate query) as a :data:`Node` over the
    aggregate / group key columns named in ``names`` (keyed by their SQL text as pglast prints
    it); ``avg``: the SQL texts of ``avg`` aggregates, never compared outside PostgreSQL
    (numeric division scale)."""
    try:
        node: Any = parse_select("SELECT " + text).targetList[0].val  # type: ignore[index]
    except UnsupportedQuery as exc:
        raise NotTranslatable(f"cannot parse {text!r}: {exc}") from exc
    return _translate(node, names, avg, params)


_NUMERIC = (int, Decimal, float, bool)


def _translate(node: Any, names: dict[str, str], avg: frozenset[str],
               params: Sequence[object] | None) -> Node:
    printed = to_sql(node)
    if printed in avg:
        raise NotTranslatable(f"{printed}: avg is not compared in Spark (numeric scale)")
    if printed in names:
        return Ref(names[printed])
    if isinstance(node, ast.A_Const):
        return _constant(node)
    if isinstance(node, ast.ParamRef):
        number = int(node.number or 0)
        if params is None or not 1 <= number <= len(params):
            raise NotTranslatable(f"parameter ${number} is not bound")
        value = params[number - 1]
        if value is not None and not isinstance(value, _NUMERIC):
            raise NotTranslatable(f"parameter ${number} of type {type(value).__name__}")
        return Lit(value)
    if isinstance(node, ast.A_Expr) and node.kind == A_Expr_Kind.AEXPR_OP \
            and len(node.name or ()) == 1:
        op = str(node.name[0].sval)  # type: ignore[index]
        if op in ARITHMETIC:
            _no_param_operand(node)
        right = _translate(node.rexpr, names, avg, params)
        if node.lexpr is None:
            if op == "-":
                return Neg(right)
            raise NotTranslatable(f"prefix operator {op}")
        if op in COMPARISONS or op in ARITHMETIC:
            return Bin(op, _translate(node.lexpr, names, avg, params), right)
        raise NotTranslatable(f"operator {op}")
    if isinstance(node, ast.BoolExpr):
        args = tuple(_translate(a, names, avg, params) for a in node.args or ())
        if node.boolop == BoolExprType.AND_EXPR:
            return BoolOp("and", args)
        if node.boolop == BoolExprType.OR_EXPR:
            return BoolOp("or", args)
        return Not(args[0])
    if isinstance(node, ast.NullTest):
        return IsNull(_translate(node.arg, names, avg, params),
                      node.nulltesttype == NullTestType.IS_NOT_NULL)
    raise NotTranslatable(f"expression {printed!r} is not evaluated outside PostgreSQL")


def _no_param_operand(node: Any) -> None:
    """Refuses a ``$n`` operand of ``+ - *`` (or of unary minus): PostgreSQL types it by the
    bound value (psycopg binds a small Python int as smallint, so ``min(s) + $1`` is int2
    arithmetic that overflows at 32767 + 1), the engine by the Python type (int). (Found: a
    smallint overflow error hidden.) A parameter compared with a value keeps its meaning."""
    for operand in (node.lexpr, node.rexpr):
        if isinstance(operand, ast.ParamRef):
            raise NotTranslatable(f"parameter ${operand.number} inside arithmetic (typed by "
                                  "its bound value in PostgreSQL)")


_INT8 = range(-2**63, 2**63)
_INTEGER = re.compile(r"[+-]?[0-9]+")


def _constant(node: Any) -> Lit:
    """The literal with PostgreSQL's type: an integer is int4, else int8 when it fits
    (pglast gives an ``ast.Float`` beyond int4; PostgreSQL's ``make_const`` types it bigint,
    so ``sum(v) * 3000000000`` overflows there — found: as a Decimal it did not in Spark),
    else numeric."""
    if node.isnull:
        return Lit(None)
    val = node.val
    if isinstance(val, ast.Integer):
        return Lit(int(val.ival or 0))
    if isinstance(val, ast.Float):
        text = str(val.fval)
        if _INTEGER.fullmatch(text) and int(text) in _INT8:
            return Lit(int(text), "int8")
        return Lit(Decimal(text))
    if isinstance(val, ast.Boolean):
        return Lit(bool(val.boolval))
    raise NotTranslatable(f"constant {to_sql(node)} (only numbers and booleans)")
