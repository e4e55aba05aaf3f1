"""Precompiled ``struct.Struct`` objects for the PostgreSQL v3 wire format (network byte order).

Every pack/unpack in the proxy goes through these, so format strings are parsed once at import.
"""

from __future__ import annotations

import struct

INT16 = struct.Struct("!h")
UINT16 = struct.Struct("!H")
INT32 = struct.Struct("!i")
UINT32 = struct.Struct("!I")
INT64 = struct.Struct("!q")
FLOAT8 = struct.Struct("!d")
#: a regular message header: type byte + length (length counts itself, not the type byte)
HEADER = struct.Struct("!ci")
#: startup-packet header: length + protocol code
STARTUP_HEADER = struct.Struct("!ii")
#: CancelRequest body after the header: pid, secret key
CANCEL_BODY = struct.Struct("!ii")
#: BackendKeyData body: pid, secret key
KEY_DATA = struct.Struct("!ii")
#: RowDescription field trailer: table oid, column number, type oid, type size, typmod, format
FIELD_TRAILER = struct.Struct("!IhIhih")

pack_int16 = INT16.pack
pack_uint16 = UINT16.pack
pack_int32 = INT32.pack
pack_header = HEADER.pack
unpack_int16_from = INT16.unpack_from
unpack_uint16_from = UINT16.unpack_from
unpack_int32_from = INT32.unpack_from
unpack_uint32_from = UINT32.unpack_from


def unpack_array_from(code: str, buf: bytes | bytearray | memoryview, pos: int,
                      n: int) -> tuple[int, ...]:
    """``n`` network-order integers of struct ``code`` (``h``, ``I``, …) at ``pos``: one
    call, not one per value (a Parse or Bind of 65535 parameters)."""
    return struct.unpack_from(f"!{n}{code}", buf, pos) if n else ()


def pack_array(code: str, values: tuple[int, ...] | list[int]) -> bytes:
    """``values`` as network-order integers of struct ``code``, in one call."""
    return struct.pack(f"!{len(values)}{code}", *values) if values else b""
