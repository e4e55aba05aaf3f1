"""``IMP …`` statements answered by the proxy itself, as ordinary result sets.

Grammar (case-insensitive, optional trailing ``;``)::

    IMP SHOW SKETCHES
    IMP SHOW STATS
    IMP EXPLAIN <select>
    IMP DROP SKETCH <id>
    IMP DROP ALL SKETCHES
    IMP SET <setting> { = | TO } <value>        -- enabled: this session only; any other
                                                -- setting goes to the library's optional
                                                -- configure(name, value) (process-wide)
    IMP SET STRATEGY { = | TO } <strategy> FOR SKETCH <id>
                                                -- one sketch of the session's database
                                                -- (lazy | eager | recapture | default)

DROP SKETCH, DROP ALL SKETCHES, SET STRATEGY … FOR SKETCH and SET of a library setting change
what every session shares: only a superuser may run them (``intercept.run_admin``).

This module parses the statement and encodes results; the session runs the commands (they
need its router, database and snapshot).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pglast.parser import ParseError, scan

from .protocol import codec
from .protocol.messages import BINARY_FORMAT, TEXT_FORMAT, FieldDescription

SKETCH_COLUMNS = ("sketch_id", "template", "tables", "attributes", "fragments",
                  "selected_fragments", "version", "strategy", "captures", "maintenances",
                  "uses", "last_used")
KEY_VALUE = ("key", "value")
SETTINGS = ("enabled",)

_IMP = re.compile(rb"\s*imp(?:[\s;\x00]|\Z)", re.IGNORECASE)


class AdminError(Exception):
    """An IMP statement failed; carries the SQLSTATE sent to the client."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.message = message


@dataclass(frozen=True, slots=True)
class AdminCommand:
    kind: str                  # show_sketches | show_stats | explain | drop | drop_all | set
                               # | set_strategy (argument: sketch id, value: strategy)
    argument: str | None = None
    value: str | None = None

    @property
    def columns(self) -> tuple[str, ...] | None:
        """Result columns (known before execution, for Describe); None = no rows."""
        if self.kind == "show_sketches":
            return SKETCH_COLUMNS
        if self.kind in ("show_stats", "explain"):
            return KEY_VALUE
        return None


@dataclass(frozen=True, slots=True)
class AdminResult:
    columns: tuple[str, ...] | None
    rows: tuple[tuple[str | None, ...], ...]
    tag: str


def is_admin(sql: bytes | bytearray, start: int = 0, end: int | None = None) -> bool:
    """Does the SQL text at ``sql[start:end]`` (a Parse body's text ends at its NUL) start
    with the keyword IMP? No copy; a few hundred ns, for the hot path. Why not a slice of its
    first bytes: ``IMP`` ending the slice read as the whole statement, so 13 blanks and
    ``IMPORT FOREIGN SCHEMA …`` were answered as an IMP statement (found by a helper's
    search)."""
    return _IMP.match(sql, start, len(sql) if end is None else end) is not None


_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"show\s+sketches", re.I), "show_sketches"),
    (re.compile(r"show\s+stats", re.I), "show_stats"),
    (re.compile(r"explain\s+(?P<arg>.+)", re.I | re.S), "explain"),
    (re.compile(r"drop\s+all\s+sketches", re.I), "drop_all"),
    (re.compile(r"drop\s+sketch\s+(?P<arg>\S+)", re.I), "drop"),
    (re.compile(r"set\s+strategy\s*(?:=|\s+to\s+)\s*(?P<value>\S+)\s+for\s+sketch\s+"
                r"(?P<arg>\S+)", re.I), "set_strategy"),
    (re.compile(r"set\s+(?P<arg>[a-z_][a-z0-9_]*)\s*(?:=|\s+to\s+)\s*(?P<value>\S+)", re.I),
     "set"),
)


def parse_admin(sql: str) -> AdminCommand:
    """Parses an ``IMP …`` statement; raises AdminError (42601) when it is not valid."""
    text = _without_comments(sql)
    while text.endswith(";"):
        text = text[:-1].rstrip()
    m = re.match(r"imp\s+(?P<rest>.*)\Z", text, re.I | re.S)
    if m is None:
        raise AdminError("42601", f"not an IMP statement: {sql[:60]!r}")
    rest = m.group("rest")
    for pattern, kind in _PATTERNS:
        pm = pattern.fullmatch(rest)
        if pm is None:
            continue
        arg = pm.groupdict().get("arg")
        value = pm.groupdict().get("value")
        if kind in ("drop", "set_strategy"):
            if arg is None or not (arg.isascii() and arg.isdigit()):   # not '²', not '١'
                raise AdminError("22P02", f"invalid sketch id: {arg!r}")
        if kind == "set_strategy":
            assert value is not None
            value = value.strip("'\"").lower()
        if kind == "set":
            assert arg is not None and value is not None
            arg = arg.lower()
            value = value.strip("'\"")
            if arg in SETTINGS:
                value = value.lower()
        return AdminCommand(kind, arg, value)
    raise AdminError("42601", "syntax error in IMP statement; expected SHOW SKETCHES, "
                     "SHOW STATS, EXPLAIN <select>, DROP SKETCH <id>, DROP ALL SKETCHES or "
                     "SET <setting> = <value>")


_COMMENTS = frozenset({"SQL_COMMENT", "C_COMMENT"})


def _without_comments(sql: str) -> str:
    """``sql`` with each comment (as PostgreSQL's own scanner finds them) replaced by a
    blank, stripped; after ``IMP EXPLAIN`` the query's text as written. Why: psql sends a
    comment that follows the statement on its line (``IMP SHOW STATS -- x``) and a comment
    may stand wherever a blank may; both were syntax errors (found by a helper's search, as
    was an unterminated quote that the patterns accepted: the scanner's error is
    PostgreSQL's). Only the comments go: the rest stays as written (``-5`` is no
    ``- 5``)."""
    try:
        tokens = list(scan(sql))
    except ParseError as exc:
        raise AdminError("42601", exc.args[0] if exc.args else str(exc)) from None
    words = [t for t in tokens if t.name not in _COMMENTS]
    if len(words) > 2 and words[1].name == "EXPLAIN":
        return f"IMP EXPLAIN {sql[words[2].start:].strip()}"
    pieces, at = [], 0
    for t in tokens:
        if t.name in _COMMENTS:
            pieces += [sql[at:t.start], " "]
            at = t.end + 1
    pieces.append(sql[at:])
    return "".join(pieces).strip()


def parse_bool_setting(value: str) -> bool:
    if value in ("on", "true", "yes", "1"):
        return True
    if value in ("off", "false", "no", "0"):
        return False
    raise AdminError("22023", f"invalid value for a boolean setting: {value!r}")


def text_value(v: object) -> str | None:
    """How a Python value from the library is shown in a text column."""
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list | tuple | set | frozenset):
        items = sorted(v, key=str) if isinstance(v, set | frozenset) else v
        return ", ".join(str(i) for i in items)
    return str(v)


def sketch_rows(sketches: Iterable[Mapping[str, object]]) -> tuple[tuple[str | None, ...], ...]:
    return tuple(tuple(text_value(s.get(c)) for c in SKETCH_COLUMNS) for s in sketches)


def key_value_rows(items: Iterable[tuple[str, object]]) -> tuple[tuple[str | None, ...], ...]:
    return tuple((k, text_value(v)) for k, v in items)


def row_description(columns: Sequence[str], result_formats: Sequence[int] = ()) -> bytes:
    """All columns are text (oid 25); in binary format text is sent as its UTF-8 bytes."""
    fmts = [_format(result_formats, i) for i in range(len(columns))]
    return codec.encode_row_description(
        [FieldDescription(name, format=f) for name, f in zip(columns, fmts, strict=True)])


def _format(result_formats: Sequence[int], i: int) -> int:
    if not result_formats:
        return TEXT_FORMAT
    f = result_formats[0] if len(result_formats) == 1 else result_formats[i]
    return BINARY_FORMAT if f == BINARY_FORMAT else TEXT_FORMAT


def encode_rows(result: AdminResult) -> bytes:
    """DataRows + CommandComplete (no RowDescription: the caller decides, Describe may have)."""
    return b"".join([*data_rows(result), codec.encode_command_complete(result.tag)])


def data_rows(result: AdminResult) -> list[bytes]:
    """One encoded DataRow per row."""
    return [codec.encode_data_row([None if v is None else v.encode() for v in row])
            for row in result.rows]


def encode_result(result: AdminResult) -> bytes:
    """A full simple-protocol answer: RowDescription (if any), DataRows, CommandComplete."""
    head = row_description(result.columns) if result.columns is not None else b""
    return head + encode_rows(result)
