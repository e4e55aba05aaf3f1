"""Statements that PostgreSQL refuses while another session is connected to a database.

``DROP DATABASE``, ``ALTER DATABASE … RENAME TO``, ``ALTER DATABASE … SET TABLESPACE`` and
``CREATE DATABASE`` (of its template) fail with "database … is being accessed by other users"
when any session is connected to the database they name. The proxy keeps sessions of its own
there (service connections, the maintenance thread's connection), so through the proxy these
failed where PostgreSQL alone would run them (found: ``dropdb`` through the proxy after one
sketched query). The session finds them with :func:`databases_named` and lets go of those
databases before forwarding the statement unchanged.

Only the statement's text decides; PostgreSQL still runs it, and still refuses it for the
client's own reasons (privileges, a client of its own still connected).
"""

from __future__ import annotations

import logging
import re

import pglast
from pglast import ast
from pglast.enums import ObjectType

log = logging.getLogger(__name__)

FIRST_BYTES = frozenset(b"DdAaCc \t\r\n-/(")
"""The bytes a Parse of such a statement can start with (the keyword, whitespace, a comment):
a Parse holds one statement, and one starting otherwise is not looked at further."""

_MENTIONS = re.compile(rb"(?i)database")
DEFAULT_TEMPLATE = "template1"


def mentions_database(buf: bytes | bytearray, start: int = 0, end: int | None = None) -> bool:
    """Cheap test before :func:`databases_named` of a Query's text, which may hold several
    statements (``SELECT 1; ALTER DATABASE …`` and ``BEGIN; … RENAME …; COMMIT`` run in
    PostgreSQL; found refused through the proxy when only the first byte was looked at): two
    byte searches, no copy (the relay's hot path). Spellings like ``dataBase`` are missed;
    such a statement then meets the proxy's sessions, as one sent directly does."""
    stop = len(buf) if end is None else end
    return buf.find(b"atabase", start, stop) >= 0 or buf.find(b"ATABASE", start, stop) >= 0


def databases_named(text: bytes) -> frozenset[str]:
    """The databases a ``text`` of one or more statements needs no other session connected to;
    empty for every other text (and for one that does not parse: PostgreSQL reports it)."""
    if _MENTIONS.search(text) is None:
        return frozenset()
    try:
        stmts = pglast.parse_sql(text.decode())
    except (pglast.parser.ParseError, UnicodeDecodeError, ValueError):
        return frozenset()
    names: set[str] = set()
    for raw in stmts:
        names.update(n for n in _named(raw.stmt) if n)
    if names:
        log.debug("statement needs databases %s to itself", sorted(names))
    return frozenset(names)


def _named(stmt: ast.Node | None) -> list[str | None]:
    if isinstance(stmt, ast.DropdbStmt):
        return [stmt.dbname]
    if isinstance(stmt, ast.RenameStmt) and stmt.renameType == ObjectType.OBJECT_DATABASE:
        return [stmt.subname]
    if isinstance(stmt, ast.AlterDatabaseStmt) and _option(stmt, "tablespace") is not None:
        return [stmt.dbname]
    if isinstance(stmt, ast.CreatedbStmt):
        return [_option(stmt, "template") or DEFAULT_TEMPLATE]
    return []


def _option(stmt: ast.AlterDatabaseStmt | ast.CreatedbStmt, name: str) -> str | None:
    for opt in stmt.options or ():
        if isinstance(opt, ast.DefElem) and opt.defname == name:
            arg = opt.arg
            return arg.sval if isinstance(arg, ast.String) else None
    return None
