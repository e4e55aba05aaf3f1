"""Encoders and decoders for the messages the proxy reads or writes.

Decoders take the *whole* message (type byte + length + body) as returned by
``MessageReader`` or sliced at ``frame_end`` boundaries; encoders return whole messages.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from ._struct import (
    FIELD_TRAILER,
    HEADER,
    KEY_DATA,
    STARTUP_HEADER,
    pack_array,
    pack_int32,
    pack_uint16,
    unpack_array_from,
    unpack_int32_from,
    unpack_uint16_from,
)
from .framing import ProtocolViolation, read_cstring
from .messages import (
    AUTH_SASL,
    CANCEL_REQUEST_CODE,
    Authentication,
    AuthenticationSASL,
    BackendKeyData,
    Bind,
    Close,
    CommandComplete,
    DataRow,
    Describe,
    ErrorResponse,
    Execute,
    FieldDescription,
    ParameterStatus,
    Parse,
    Query,
    ReadyForQuery,
    RowDescription,
)

_SYNC = b"S\x00\x00\x00\x04"
_FLUSH = b"H\x00\x00\x00\x04"
_TERMINATE = b"X\x00\x00\x00\x04"
_PARSE_COMPLETE = b"1\x00\x00\x00\x04"
_BIND_COMPLETE = b"2\x00\x00\x00\x04"
_CLOSE_COMPLETE = b"3\x00\x00\x00\x04"
_NO_DATA = b"n\x00\x00\x00\x04"
_EMPTY_QUERY = b"I\x00\x00\x00\x04"
_PORTAL_SUSPENDED = b"s\x00\x00\x00\x04"


def _message(typ: bytes, body: bytes) -> bytes:
    return HEADER.pack(typ, len(body) + 4) + body


def _cstr(s: str) -> bytes:
    b = s.encode()
    if b"\x00" in b:
        raise ValueError("NUL byte in protocol string")
    return b + b"\x00"


_F = TypeVar("_F", bound=Callable[..., Any])


def _strict(fn: _F) -> _F:
    """A decoder given a body shorter or otherwise other than its type allows raises
    ProtocolViolation (the session's FATAL 08P01), never struct.error/IndexError."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (struct.error, IndexError, UnicodeDecodeError) as exc:
            raise ProtocolViolation(f"malformed message: {exc}") from exc
    return wrapper  # type: ignore[return-value]


def _check_type(msg: bytes, typ: str) -> None:
    if not msg or msg[0] != ord(typ):
        raise ProtocolViolation(f"expected message {typ!r}, got {msg[:1]!r}")


# ---------------------------------------------------------------- frontend: decode

@_strict
def decode_query(msg: bytes) -> Query:
    _check_type(msg, "Q")
    sql, _ = read_cstring(msg, 5)
    return Query(sql)


def query_text_bytes(msg: bytes | bytearray | memoryview) -> bytes:
    """The raw SQL bytes of a Query message without decoding (for cheap prefix checks)."""
    return bytes(msg[5:-1])


@_strict
def decode_parse(msg: bytes) -> Parse:
    _check_type(msg, "P")
    name, pos = read_cstring(msg, 5)
    sql, pos = read_cstring(msg, pos)
    n = unpack_uint16_from(msg, pos)[0]
    pos += 2
    if pos + 4 * n != len(msg):
        raise ProtocolViolation("invalid parameter count in Parse")
    types = unpack_array_from("I", msg, pos, n)
    return Parse(name, sql, types)


@_strict
def decode_bind(msg: bytes) -> Bind:
    """Counts are unsigned (PostgreSQL reads them so: up to 65535 parameters), and the body
    must end where its last result format code does (found: a Bind PostgreSQL answers with
    08P01, a count of 65535 without the parameters or bytes after the codes, was decoded as
    something else, wrapped and answered with rows)."""
    _check_type(msg, "B")
    try:
        portal, pos = read_cstring(msg, 5)
        stmt, pos = read_cstring(msg, pos)
        nf = unpack_uint16_from(msg, pos)[0]
        pos += 2
        formats = unpack_array_from("h", msg, pos, nf)
        pos += 2 * nf
        np_ = unpack_uint16_from(msg, pos)[0]
        pos += 2
        params: list[bytes | None] = []
        for _ in range(np_):
            ln = unpack_int32_from(msg, pos)[0]
            pos += 4
            if ln < 0:
                params.append(None)
            else:
                if pos + ln > len(msg):
                    raise ProtocolViolation("Bind parameter exceeds message")
                params.append(bytes(msg[pos:pos + ln]))
                pos += ln
        nr = unpack_uint16_from(msg, pos)[0]
        pos += 2
        rformats = unpack_array_from("h", msg, pos, nr)
        pos += 2 * nr
    except struct.error as exc:  # a truncated body
        raise ProtocolViolation(f"malformed Bind message: {exc}") from exc
    if pos != len(msg):
        raise ProtocolViolation("Bind: bytes after the result format codes")
    if nf not in (0, 1, np_):
        raise ProtocolViolation("Bind: format code count does not match parameter count")
    return Bind(portal, stmt, formats, tuple(params), rformats)


@_strict
def decode_describe(msg: bytes) -> Describe:
    _check_type(msg, "D")
    kind = chr(msg[5])
    name, _ = read_cstring(msg, 6)
    if kind not in "SP":
        raise ProtocolViolation(f"invalid Describe kind {kind!r}")
    return Describe(kind, name)


@_strict
def decode_close(msg: bytes) -> Close:
    _check_type(msg, "C")
    kind = chr(msg[5])
    name, _ = read_cstring(msg, 6)
    if kind not in "SP":
        raise ProtocolViolation(f"invalid Close kind {kind!r}")
    return Close(kind, name)


@_strict
def decode_execute(msg: bytes) -> Execute:
    _check_type(msg, "E")
    portal, pos = read_cstring(msg, 5)
    return Execute(portal, unpack_int32_from(msg, pos)[0])


# ---------------------------------------------------------------- frontend: encode

def encode_query(sql: str) -> bytes:
    return _message(b"Q", _cstr(sql))


def encode_parse(name: str, sql: str, param_types: Sequence[int] = ()) -> bytes:
    body = _cstr(name) + _cstr(sql) + pack_uint16(len(param_types))
    body += pack_array("I", [int(t) for t in param_types])
    return _message(b"P", body)


def encode_bind(bind: Bind) -> bytes:
    parts = [_cstr(bind.portal), _cstr(bind.statement), pack_uint16(len(bind.param_formats))]
    parts.append(pack_array("h", list(bind.param_formats)))
    parts.append(pack_uint16(len(bind.params)))
    for p in bind.params:
        if p is None:
            parts.append(pack_int32(-1))
        else:
            parts.append(pack_int32(len(p)))
            parts.append(p)
    parts.append(pack_uint16(len(bind.result_formats)))
    parts.append(pack_array("h", list(bind.result_formats)))
    return _message(b"B", b"".join(parts))


def encode_describe(kind: str, name: str) -> bytes:
    return _message(b"D", kind.encode() + _cstr(name))


def encode_execute(portal: str, max_rows: int = 0) -> bytes:
    return _message(b"E", _cstr(portal) + pack_int32(max_rows))


def encode_close(kind: str, name: str) -> bytes:
    return _message(b"C", kind.encode() + _cstr(name))


def encode_sync() -> bytes:
    return _SYNC


def encode_flush() -> bytes:
    return _FLUSH


def encode_terminate() -> bytes:
    return _TERMINATE


def encode_cancel_request(pid: int, secret: int) -> bytes:
    return STARTUP_HEADER.pack(16, CANCEL_REQUEST_CODE) + KEY_DATA.pack(pid, secret)


def encode_startup(params: dict[str, str], protocol: int = 196608) -> bytes:
    body = b"".join(_cstr(k) + _cstr(v) for k, v in params.items()) + b"\x00"
    return STARTUP_HEADER.pack(len(body) + 8, protocol) + body


# ---------------------------------------------------------------- backend: decode

@_strict
def decode_ready_for_query(msg: bytes) -> ReadyForQuery:
    _check_type(msg, "Z")
    return ReadyForQuery(chr(msg[5]))


@_strict
def decode_error_fields(msg: bytes) -> ErrorResponse:
    """ErrorResponse ('E') or NoticeResponse ('N')."""
    if not msg or msg[0] not in (ord("E"), ord("N")):
        raise ProtocolViolation(f"expected ErrorResponse/NoticeResponse, got {msg[:1]!r}")
    fields: dict[str, str] = {}
    pos = 5
    while pos < len(msg) and msg[pos] != 0:
        code = chr(msg[pos])
        value, pos = read_cstring(msg, pos + 1)
        fields[code] = value
    return ErrorResponse(fields)


@_strict
def decode_backend_key_data(msg: bytes) -> BackendKeyData:
    _check_type(msg, "K")
    pid, secret = KEY_DATA.unpack_from(msg, 5)
    return BackendKeyData(pid, secret)


@_strict
def decode_parameter_status(msg: bytes) -> ParameterStatus:
    _check_type(msg, "S")
    name, pos = read_cstring(msg, 5)
    value, _ = read_cstring(msg, pos)
    return ParameterStatus(name, value)


@_strict
def decode_authentication(msg: bytes) -> Authentication | AuthenticationSASL:
    _check_type(msg, "R")
    code = unpack_int32_from(msg, 5)[0]
    if code == AUTH_SASL:
        names = [n.decode() for n in msg[9:].split(b"\x00") if n]
        return AuthenticationSASL(tuple(names))
    return Authentication(code, bytes(msg[9:]))


@_strict
def decode_row_description(msg: bytes) -> RowDescription:
    _check_type(msg, "T")
    n = unpack_uint16_from(msg, 5)[0]
    pos = 7
    fields = []
    for _ in range(n):
        name, pos = read_cstring(msg, pos)
        table, col, typ, size, mod, fmt = FIELD_TRAILER.unpack_from(msg, pos)
        pos += FIELD_TRAILER.size
        fields.append(FieldDescription(name, table, col, typ, size, mod, fmt))
    return RowDescription(tuple(fields))


@_strict
def decode_data_row(msg: bytes) -> DataRow:
    _check_type(msg, "D")
    n = unpack_uint16_from(msg, 5)[0]
    pos = 7
    values: list[bytes | None] = []
    for _ in range(n):
        ln = unpack_int32_from(msg, pos)[0]
        pos += 4
        if ln < 0:
            values.append(None)
        else:
            if pos + ln > len(msg):
                raise ProtocolViolation("DataRow value runs past the end of the message")
            values.append(bytes(msg[pos:pos + ln]))
            pos += ln
    return DataRow(tuple(values))


@_strict
def decode_command_complete(msg: bytes) -> CommandComplete:
    _check_type(msg, "C")
    tag, _ = read_cstring(msg, 5)
    return CommandComplete(tag)


# ---------------------------------------------------------------- backend: encode

def encode_authentication_sasl(mechanisms: Iterable[str]) -> bytes:
    body = pack_int32(AUTH_SASL) + b"".join(_cstr(m) for m in mechanisms) + b"\x00"
    return _message(b"R", body)


def encode_backend_key_data(pid: int, secret: int) -> bytes:
    return _message(b"K", KEY_DATA.pack(pid, secret))


def encode_parameter_status(name: str, value: str) -> bytes:
    return _message(b"S", _cstr(name) + _cstr(value))


def encode_ready_for_query(status: str) -> bytes:
    return _message(b"Z", status.encode())


def encode_error(severity: str, sqlstate: str, message: str, *, notice: bool = False,
                 detail: str | None = None, hint: str | None = None) -> bytes:
    """ErrorResponse (or NoticeResponse) with S, V, C, M and optional D, H fields."""
    body = b"S" + _cstr(severity) + b"V" + _cstr(severity) + b"C" + _cstr(sqlstate)
    body += b"M" + _cstr(message)
    if detail:
        body += b"D" + _cstr(detail)
    if hint:
        body += b"H" + _cstr(hint)
    return _message(b"N" if notice else b"E", body + b"\x00")


def encode_row_description(fields: Sequence[FieldDescription]) -> bytes:
    parts = [pack_uint16(len(fields))]
    for f in fields:
        parts.append(_cstr(f.name))
        parts.append(FIELD_TRAILER.pack(f.table_oid, f.column, f.type_oid, f.type_size,
                                        f.type_modifier, f.format))
    return _message(b"T", b"".join(parts))


def encode_data_row(values: Sequence[bytes | None]) -> bytes:
    parts = [pack_uint16(len(values))]
    for v in values:
        if v is None:
            parts.append(pack_int32(-1))
        else:
            parts.append(pack_int32(len(v)))
            parts.append(v)
    return _message(b"D", b"".join(parts))


def encode_command_complete(tag: str) -> bytes:
    return _message(b"C", _cstr(tag))


def encode_parameter_description(type_oids: Sequence[int]) -> bytes:
    return _message(b"t", pack_uint16(len(type_oids))
                    + pack_array("I", [int(t) for t in type_oids]))


def parse_complete() -> bytes:
    return _PARSE_COMPLETE


def bind_complete() -> bytes:
    return _BIND_COMPLETE


def close_complete() -> bytes:
    return _CLOSE_COMPLETE


def no_data() -> bytes:
    return _NO_DATA


def empty_query_response() -> bytes:
    return _EMPTY_QUERY


def portal_suspended() -> bytes:
    return _PORTAL_SUSPENDED


@_strict
def strip_channel_binding(msg: bytes) -> bytes:
    """An AuthenticationSASL message without the ``-PLUS`` (channel binding) mechanisms.

    The proxy terminates the client's TLS (if any) itself, so the client's channel can never be
    bound to the upstream's TLS certificate: advertising SCRAM-SHA-256-PLUS would make a
    channel-binding client fail. Other authentication messages are returned unchanged.
    """
    auth = decode_authentication(msg)
    if not isinstance(auth, AuthenticationSASL):
        return msg
    kept = [m for m in auth.mechanisms if not m.endswith("-PLUS")]
    if len(kept) == len(auth.mechanisms):
        return msg
    return encode_authentication_sasl(kept)
