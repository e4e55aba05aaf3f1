# pglast's stubs type every node attribute as Optional; the parser fills the ones read here
# for the node kinds checked first, so these checks would only add noise:
# mypy: disable-error-code="union-attr,index,arg-type,operator,misc,attr-defined,return-value"
"""Parsing, printing, fingerprinting and the re-parse safety belt."""

from __future__ import annotations

import logging

from pglast import ast, parse_sql
from pglast.parser import ParseError, scan
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
    refused = refused_token(sql)
    if refused is not None:
        raise UnsupportedQuery(refused)
    return stmt


_NUMBER_TOKENS = frozenset({"ICONST", "FCONST"})
MAX_IDENTIFIER_BYTES = 63
"""PostgreSQL's NAMEDATALEN - 1: a longer identifier is truncated, with a NOTICE."""


def refused_token(sql: str) -> str | None:
    """Why a token of ``sql`` keeps it from being rewritten, else None.

    A numeric literal of a form PostgreSQL 16 introduced (``0x10``, ``0o20``, ``0b1``,
    ``1_000``): pglast parses with a newer grammar and prints such a literal as a plain
    decimal, so the rewritten query ran where PostgreSQL 15 rejects the client's (found:
    ``HAVING count(*) > 0x10`` answered rows instead of 42601). An identifier longer than
    63 bytes: PostgreSQL truncates it with NOTICE 42622, but pglast's parser has truncated
    it already, so the rewritten query raised no NOTICE (found by a regression search: a
    70-character alias). A ``U&"…"`` identifier counts as written (escapes not decoded)."""
    for token in scan(sql):
        text = sql[token.start:token.end + 1]
        if token.name in _NUMBER_TOKENS:
            if "_" in text or text[:2].lower() in ("0x", "0o", "0b"):
                return f"the literal {text} is a syntax error in PostgreSQL 15"
        elif token.name in ("IDENT", "UIDENT") and len(_identifier(text).encode()) \
                > MAX_IDENTIFIER_BYTES:
            return (f"the identifier {text[:40]}… is longer than {MAX_IDENTIFIER_BYTES} "
                    "bytes: PostgreSQL truncates it with a NOTICE")
    return None


def _identifier(text: str) -> str:
    """An IDENT token's name as PostgreSQL stores it (before truncation)."""
    if text.startswith('"'):
        return text[1:-1].replace('""', '"')
    return text


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
    where the parser fills them in (:func:`tree_key`)."""
    return tree_key(a) == tree_key(b)


def tree_key(node: object) -> object:
    """A value equal for two trees exactly when they are the same tree (:func:`same_tree`).
    Why a key: a query's skeleton was walked against every kept sketch's skeleton of its
    template (about 60 µs a pair); a key is built once per tree and compared at C speed."""
    if isinstance(node, ast.Node):
        ignore = node._ATTRS_TO_IGNORE_IN_COMPARISON
        attrs = []
        for k in node:
            if k not in ignore:
                value = tree_key(getattr(node, k, None))
                if value is not None:
                    attrs.append((k, value))
        return type(node), tuple(attrs)
    if isinstance(node, tuple) and node:
        return "tuple", tuple(tree_key(x) for x in node)
    return node if node else None


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
