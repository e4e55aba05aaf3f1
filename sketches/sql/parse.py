# pglast's stubs type every node attribute as Optional; the parser fills the ones read here
# for the node kinds checked first, so these checks would only add noise:
# mypy: disable-error-code="union-attr,index,arg-type,operator,misc,attr-defined,return-value"
"""Parsing, printing, fingerprinting and the re-parse safety belt."""

from __future__ import annotations

import logging

from pglast import ast, parse_sql
from pglast.parser import ParseError
from pglast.parser import fingerprint as _fingerprint
from pglast.stream import RawStream

from sketches.errors import InstrumentationError, UnsupportedQuery

log = logging.getLogger(__name__)


def parse_select(sql: str) -> ast.SelectStmt:
    """The single SELECT statement of ``sql``; UnsupportedQuery for anything else."""
    try:
        stmts = parse_sql(sql)
    except ParseError as exc:
        raise UnsupportedQuery(f"parse error: {exc}") from exc
    if len(stmts) != 1:
        raise UnsupportedQuery("not exactly one statement")
    stmt = stmts[0].stmt
    if not isinstance(stmt, ast.SelectStmt):
        raise UnsupportedQuery(f"not a SELECT ({type(stmt).__name__})")
    return stmt


def to_sql(node: ast.Node) -> str:
    """PostgreSQL text of an AST node (statement or expression)."""
    return str(RawStream()(node))


def fingerprint(sql: str) -> str:
    """The template key: pglast's fingerprint (constants and parameters abstracted away)."""
    try:
        return str(_fingerprint(sql))
    except ParseError as exc:
        raise UnsupportedQuery(f"parse error: {exc}") from exc


def print_checked(stmt: ast.SelectStmt) -> str:
    """Prints ``stmt`` and re-parses the text; raises InstrumentationError unless the re-parsed
    tree equals ``stmt`` (pglast's safety belt: positions are ignored by the comparison)."""
    text = to_sql(stmt)
    try:
        again = parse_select(text)
    except UnsupportedQuery as exc:
        raise InstrumentationError(f"rewritten query does not parse: {exc}") from exc
    if not same_tree(again, stmt):
        raise InstrumentationError("rewritten query re-parses to a different tree")
    return text


def same_tree(a: object, b: object) -> bool:
    """Structural equality of two ASTs ignoring positions, treating unset attributes and
    their zero values (None/False/0/empty) alike: nodes built by hand leave defaults unset
    where the parser fills them in."""
    if isinstance(a, ast.Node) or isinstance(b, ast.Node):
        if type(a) is not type(b):
            return False
        assert isinstance(a, ast.Node) and isinstance(b, ast.Node)
        ignore = a._ATTRS_TO_IGNORE_IN_COMPARISON
        return all(same_tree(getattr(a, k, None), getattr(b, k, None))
                   for k in set(a) | set(b) if k not in ignore)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same_tree(x, y) for x, y in zip(a, b, strict=True))
    if not a and not b:
        return True
    return a == b


def scopes(stmt: ast.SelectStmt) -> list[ast.SelectStmt]:
    """The SELECTs whose FROM lists tables: ``stmt`` first, then FROM subqueries in pre-order
    (left to right, depth first). Analysis and rewriting both number scopes with this."""
    out: list[ast.SelectStmt] = []

    def visit(select: ast.SelectStmt) -> None:
        out.append(select)
        for item in select.fromClause or ():
            visit_from(item)

    def visit_from(item: ast.Node) -> None:
        if isinstance(item, ast.JoinExpr):
            visit_from(item.larg)
            visit_from(item.rarg)
        elif isinstance(item, ast.RangeSubselect) and isinstance(item.subquery, ast.SelectStmt):
            visit(item.subquery)

    visit(stmt)
    return out
