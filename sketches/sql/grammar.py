# pglast's stubs type every node attribute as Optional; the parser fills the ones read here:
# mypy: disable-error-code="union-attr,index,arg-type,return-value"
"""What the supported class admits: aggregates, functions, operator kinds, node types."""

from __future__ import annotations

import re

from pglast import ast
from pglast.enums import A_Expr_Kind

AGGREGATES = frozenset({"count", "sum", "avg", "min", "max"})

# Immutable (or at least snapshot- and transaction-independent) functions. Anything reading
# the clock, a sequence or randomness would differ between the capture and the query.
FUNCTIONS = frozenset({
    "abs", "lower", "upper", "length", "char_length", "character_length", "octet_length",
    "substr", "substring", "left", "right", "btrim", "ltrim", "rtrim", "trim", "replace",
    "strpos", "position", "round", "floor", "ceil", "ceiling", "trunc", "mod", "sqrt", "power",
    "sign", "exp", "ln", "log", "date_part", "extract", "date_trunc", "md5", "split_part",
    "reverse", "lpad", "rpad", "initcap",
})

_CLOCK_WORDS = re.compile(r"(?<![a-z])(now|today|tomorrow|yesterday)(?![a-z])", re.IGNORECASE)


def reads_the_clock(text: str) -> bool:
    """Could PostgreSQL's date/time input read ``text`` as the current time or date ('now',
    'today', 'tomorrow', 'yesterday', alone or in a longer value)? Such a literal means
    another instant in every transaction, so a sketch captured once would be applied to a
    query that asks something else. Word-level and type-blind: a text value that merely
    holds the word is refused too, which only costs a passthrough."""
    return _CLOCK_WORDS.search(text) is not None


CATALOG_NAME_TYPES = frozenset({
    "regclass", "regcollation", "regconfig", "regdictionary", "regnamespace", "regoper",
    "regoperator", "regproc", "regprocedure", "regrole", "regtype",
})
"""Types whose input looks a name up in the catalog (on the search_path): ``'t'::regclass``
is another oid once ``t`` is dropped and created again, or in a session whose path finds
another ``t`` — in tables the sketch does not depend on."""

EXPR_KINDS = frozenset({
    A_Expr_Kind.AEXPR_OP, A_Expr_Kind.AEXPR_OP_ANY, A_Expr_Kind.AEXPR_OP_ALL,
    A_Expr_Kind.AEXPR_DISTINCT, A_Expr_Kind.AEXPR_NOT_DISTINCT, A_Expr_Kind.AEXPR_NULLIF,
    A_Expr_Kind.AEXPR_IN, A_Expr_Kind.AEXPR_LIKE, A_Expr_Kind.AEXPR_ILIKE,
    A_Expr_Kind.AEXPR_SIMILAR, A_Expr_Kind.AEXPR_BETWEEN, A_Expr_Kind.AEXPR_NOT_BETWEEN,
    A_Expr_Kind.AEXPR_BETWEEN_SYM, A_Expr_Kind.AEXPR_NOT_BETWEEN_SYM,
})

# Nodes accepted as they are (their children are walked generically).
PLAIN_NODES: tuple[type, ...] = (
    ast.A_Const, ast.BoolExpr, ast.NullTest, ast.BooleanTest, ast.TypeCast, ast.CoalesceExpr,
    ast.MinMaxExpr, ast.CaseExpr, ast.CaseWhen, ast.A_ArrayExpr, ast.String, ast.Integer,
    ast.Float, ast.Boolean, ast.BitString, ast.CollateClause,
)
LEAF_NODES: tuple[type, ...] = (ast.TypeName,)


def implicit_name(node: ast.Node) -> str | None:
    """The output name PostgreSQL gives an unaliased select item (when it is simple)."""
    if isinstance(node, ast.ColumnRef) and isinstance(node.fields[-1], ast.String):
        return str(node.fields[-1].sval)
    if isinstance(node, ast.FuncCall):
        return str(node.funcname[-1].sval)
    if isinstance(node, ast.TypeCast):
        return implicit_name(node.arg)
    return None
