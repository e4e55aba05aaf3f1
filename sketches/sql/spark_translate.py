"""Expressions of an analysed query in a form another engine evaluates (issue 5).

The Spark backend (``sketches.backends.plan`` / ``spark``) runs the part of a query whose
semantics it reproduces exactly; this module is the pglast side of that split (only
``sketches.sql`` imports pglast):

* :func:`inline_params` — a PostgreSQL expression with every ``$n`` replaced by the literal
  of its bound value (printed by the caller, e.g. with psycopg), so a pushed-down query means
  the same without parameters;
* :func:`translate` — HAVING or an ORDER BY key of an aggregate query as a tiny, engine-neutral
  expression tree (:data:`Node`): comparisons, ``+ - *``, AND/OR/NOT and IS [NOT] NULL over
  named aggregates / group keys and numeric or boolean constants. Anything else raises
  :class:`NotTranslatable` (the caller runs the job in PostgreSQL instead).

>>> translate("sum(v) > 10 AND g IS NOT NULL", {"sum(v)": "a0", "g": "e0"}, frozenset(), None)
BoolOp(op='and', args=(Bin(op='>', left=Ref(name='a0'), right=Lit(value=10)), \
IsNull(arg=Ref(name='e0'), negated=True)))
"""

from __future__ import annotations

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
    value: Any


@dataclass(frozen=True, slots=True)
class Bin:
    op: str  # = <> < <= > >= + - *
    left: Node
    right: Node


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


Node = Ref | Lit | Bin | BoolOp | Not | IsNull

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
        return Lit(_constant(node))
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
        right = _translate(node.rexpr, names, avg, params)
        if node.lexpr is None:
            if op == "-":
                return Bin("-", Lit(0), right)
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


def _constant(node: Any) -> object:
    if node.isnull:
        return None
    val = node.val
    if isinstance(val, ast.Integer):
        return int(val.ival or 0)
    if isinstance(val, ast.Float):
        return Decimal(str(val.fval))  # a numeric literal in PostgreSQL
    if isinstance(val, ast.Boolean):
        return bool(val.boolval)
    raise NotTranslatable(f"constant {to_sql(node)} (only numbers and booleans)")
