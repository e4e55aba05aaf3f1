# pglast's stubs type every node attribute as Optional; the parser fills the ones read here
# for the node kinds checked first, so these checks would only add noise:
# mypy: disable-error-code="union-attr,index,arg-type,operator,misc,attr-defined,return-value"
"""Templates: when may a sketch captured for one query answer another query of its template?

Two queries share a template when their pglast fingerprints are equal (constants and
parameters abstracted away). A sketch captured for Q1 may be used for Q2 when Q2's
provenance is contained in the rows the sketch covers and Q2 has the same safe attributes.
We accept exactly these provable cases (everything else: capture anew):

* Q2 equals Q1 after substituting parameter values (same constants everywhere): same result,
  same provenance.
* Q1 and Q2 differ only in the constants of HAVING conjuncts of the form ``expr op c``
  (``op`` one of ``> >= < <=``, ``expr`` the same), each one at least as strict in Q2
  (``c2 >= c1`` for ``>``/``>=``, ``c2 <= c1`` for ``<``/``<=``), and the query has no LIMIT:
  every group of Q2's result passes Q1's HAVING on the *same* value of ``expr``, so it is in
  Q1's result; Q1's sketch covers its rows; the safe attribute (a group-by column) is the
  same, so the sketch is a safe over-approximation for Q2.
* Q1 and Q2 differ only in ``LIMIT`` with ``k2 <= k1``: Q1's sketch covers every row ordered
  at or before Q1's k1-th row (ties included, see ``sketches.safety``), which contains every
  row at or before Q2's k2-th row. HAVING constants must then be equal: a stricter HAVING can
  remove groups from the top k1 and promote groups that Q1's sketch does not cover.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from pglast import ast
from pglast.enums import A_Expr_Kind, BoolExprType

from sketches.sql.parse import fingerprint, parse_select, tree_key

_MARK = "__imp_marker"
_FLIP = {">": "<", ">=": "<=", "<": ">", "<=": ">="}


@dataclass(frozen=True, slots=True)
class Threshold:
    """A HAVING conjunct ``expr op value`` (normalised so ``expr`` is on the left).
    ``exact``: the value is a literal or an integer or numeric parameter; a float parameter
    is a float8, and ``sum(n) > $1`` then compares as float8 (found: the sketch of ``1.0``
    as a float answered the numeric ``1``, whose exact comparison keeps a group
    ``1.00000000000000000001`` the float8 one drops: 0 rows instead of 1)."""

    op: str
    value: Decimal
    exact: bool = True


@dataclass(frozen=True, slots=True)
class TemplateInstance:
    """A query reduced to its template skeleton plus the values that may vary safely."""

    fingerprint: str
    skeleton: ast.SelectStmt
    thresholds: tuple[Threshold, ...]
    limit: int | None
    skeleton_key: object = field(compare=False, repr=False)
    """:func:`sketches.sql.parse.tree_key` of ``skeleton``."""


def _number(node: object, params: Sequence[object] | None) -> tuple[Decimal, bool] | None:
    """A numeric literal or parameter's value, and whether it is exact (not a float).

    Only int, Decimal and float parameters are numbers: a text parameter compares as text
    (found: ``max(s) > $1`` with ``'10'`` reused the sketch of ``'5'`` as stricter, where
    ``'2' > '10'``: a group missing). NaN and infinities are no thresholds (their order is
    PostgreSQL's, not Decimal's)."""
    if isinstance(node, ast.A_Const) and isinstance(node.val, ast.Integer):
        return Decimal(node.val.ival), True
    if isinstance(node, ast.A_Const) and isinstance(node.val, ast.Float):
        return Decimal(node.val.fval), True
    if isinstance(node, ast.ParamRef) and params is not None and node.number <= len(params):
        value = params[node.number - 1]
        if type(value) not in (int, Decimal, float):
            return None
        number = Decimal(repr(value)) if type(value) is float else Decimal(value)
        return (number, type(value) is not float) if number.is_finite() else None
    return None


def _marker(text: str = _MARK) -> ast.A_Const:
    """A constant no SQL text parses to (a bit string's value starts with ``b`` or ``x``):
    found, a parameter's marker was a string constant, and the query with the literal
    ``'$param:x'`` shared a sketch with the one binding ``'x'``."""
    return ast.A_Const(isnull=False, val=ast.BitString(bsval="$" + text))


def _substitute_params(node: object, params: Sequence[object] | None) -> object:
    """Replaces ``$n`` by a :func:`_marker` of its Python type and value (for comparing
    skeletons only): values of one text and other types mean other things to PostgreSQL
    (``x = $1`` on a numeric column compares a float8 as float8; ``v / $1`` divides by an
    integer ``2`` as integers, by a numeric ``2`` as numerics, and a text ``'2'`` is what
    PostgreSQL infers: found, the sketch of one answered another, a group missing)."""
    if isinstance(node, tuple):
        return tuple(_substitute_params(n, params) for n in node)
    if isinstance(node, ast.ParamRef):
        if params is None or node.number > len(params):
            return node
        value = params[node.number - 1]
        if value is None:
            return ast.A_Const(isnull=True)
        text = repr(value) if type(value) is float else str(value)
        return _marker(f"param:{type(value).__name__}:{text}")
    if isinstance(node, ast.Node):
        for attr in node:
            value = getattr(node, attr)
            if isinstance(value, (ast.Node, tuple)):
                setattr(node, attr, _substitute_params(value, params))
    return node


def _conjuncts(node: ast.Node | None) -> list[ast.Node]:
    if node is None:
        return []
    if isinstance(node, ast.BoolExpr) and node.boolop == BoolExprType.AND_EXPR:
        return [c for a in node.args for c in _conjuncts(a)]
    return [node]


def _threshold(conj: ast.Node, params: Sequence[object] | None) -> Threshold | None:
    """Extracts ``expr op constant`` and replaces the constant by a marker (in place)."""
    if not (isinstance(conj, ast.A_Expr) and conj.kind == A_Expr_Kind.AEXPR_OP
            and len(conj.name) == 1 and conj.name[0].sval in _FLIP):
        return None
    op = conj.name[0].sval
    right = _number(conj.rexpr, params)
    left = _number(conj.lexpr, params)
    if right is not None and left is None:
        conj.rexpr = _marker()
        return Threshold(op, *right)
    if left is not None and right is None:
        conj.lexpr = _marker()
        return Threshold(_FLIP[op], *left)
    return None


def instance(sql: str, params: Sequence[object] | None = None) -> TemplateInstance:
    """The template instance of ``sql`` with ``params``."""
    stmt = parse_select(sql)   # a tree of its own: marked in place below
    thresholds: list[Threshold] = []
    for conj in _conjuncts(stmt.havingClause):
        t = _threshold(conj, params)
        if t is not None:
            thresholds.append(t)
    limit = None
    number = _number(stmt.limitCount, params) if stmt.limitCount is not None else None
    if number is not None and number[0] == number[0].to_integral_value():
        limit = int(number[0])
        stmt.limitCount = _marker()
    _substitute_params(stmt, params)
    return TemplateInstance(fingerprint(sql), stmt, tuple(thresholds), limit, tree_key(stmt))


def _stricter(new: Threshold, old: Threshold) -> bool:
    if new.op != old.op or new.exact != old.exact:
        return False
    if new.op in (">", ">="):
        return new.value >= old.value
    return new.value <= old.value


def reusable(captured: TemplateInstance, new: TemplateInstance) -> bool:
    """True when a sketch captured for ``captured`` is provably safe and sufficient for
    ``new`` (see the module docstring)."""
    if captured.fingerprint != new.fingerprint:
        return False
    if len(captured.thresholds) != len(new.thresholds):
        return False
    if (captured.limit is None) != (new.limit is None):
        return False
    if captured.skeleton_key != new.skeleton_key:
        return False
    if captured.limit is not None and new.limit is not None:
        return new.limit <= captured.limit and captured.thresholds == new.thresholds
    if captured.skeleton.limitCount is not None:
        # a LIMIT kept in the skeleton (a text or fractional k): a stricter HAVING lets other
        # groups into the top k (found: LIMIT $2 with 2.5 reused a looser HAVING's sketch)
        return captured.thresholds == new.thresholds
    return all(_stricter(n, o) for n, o in zip(new.thresholds, captured.thresholds,
                                                strict=True))
