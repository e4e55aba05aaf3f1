"""Sans-IO framing of the PostgreSQL v3 protocol: where messages begin and end.

Nothing here touches a socket. The proxy feeds the bytes it received and gets back boundaries
(offsets into the caller's buffer, so nothing is copied on the relay's hot path), complete
messages, or decoded startup packets.
"""

from __future__ import annotations

from ._struct import CANCEL_BODY, STARTUP_HEADER, unpack_int32_from
from .messages import (
    CANCEL_REQUEST_CODE,
    GSSENC_REQUEST_CODE,
    SSL_REQUEST_CODE,
    CancelRequest,
    GSSENCRequest,
    SSLRequest,
    StartupMessage,
    StartupPacket,
)

#: PostgreSQL's own limit for a startup packet (MAX_STARTUP_PACKET_LENGTH)
MAX_STARTUP_PACKET = 10000
#: PostgreSQL's limit for one message (PQ_LARGE_MESSAGE_LIMIT: MaxAllocSize - 1)
DEFAULT_MAX_MESSAGE = 0x3FFFFFFF - 1
READY_FOR_QUERY = 90  # b"Z"
_PARAMETER_STATUS = 83  # b"S"


class ProtocolViolation(Exception):
    """The peer sent bytes that are not a valid v3 protocol frame (SQLSTATE 08P01)."""

    sqlstate = "08P01"


def split_startup(buf: bytes | bytearray) -> tuple[bytes | None, int]:
    """The first complete startup packet in ``buf`` and its length, or (None, 0) if incomplete.

    Raises ProtocolViolation for an impossible length.
    """
    if len(buf) < 8:
        return None, 0
    length = unpack_int32_from(buf, 0)[0]
    if length < 8 or length > MAX_STARTUP_PACKET:
        raise ProtocolViolation(f"invalid length of startup packet: {length}")
    if len(buf) < length:
        return None, 0
    return bytes(buf[:length]), length


def decode_startup(packet: bytes) -> StartupPacket:
    """Decodes one complete startup packet (SSLRequest, GSSENCRequest, CancelRequest, startup)."""
    length, code = STARTUP_HEADER.unpack_from(packet, 0)
    if code == SSL_REQUEST_CODE and length == 8:
        return SSLRequest()
    if code == GSSENC_REQUEST_CODE and length == 8:
        return GSSENCRequest()
    if code == CANCEL_REQUEST_CODE and length == 16:
        pid, secret = CANCEL_BODY.unpack_from(packet, 8)
        return CancelRequest(pid, secret)
    if code >> 16 != 3:
        raise ProtocolViolation(f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}")
    parts = packet[8:].split(b"\x00")
    # a well-formed packet ends with an empty name: "k\0v\0...\0" -> [..., b"", b""]
    if len(parts) < 2 or parts[-1] != b"" or parts[-2] != b"":
        raise ProtocolViolation("invalid startup packet layout: missing terminator")
    items = parts[:-2]
    if len(items) % 2:
        raise ProtocolViolation("invalid startup packet layout: odd number of strings")
    try:
        params = {items[i].decode(): items[i + 1].decode() for i in range(0, len(items), 2)}
    except UnicodeDecodeError as exc:
        raise ProtocolViolation("invalid startup packet: parameters are not UTF-8") from exc
    return StartupMessage(code, params, packet)


def frame_end(buf: bytes | bytearray | memoryview, pos: int, max_size: int) -> int:
    """End offset of the regular message starting at ``pos``, or -1 when it is not complete yet.

    Raises ProtocolViolation when the declared length is below 4 or above ``max_size``.
    """
    if pos + 5 > len(buf):
        return -1
    length = unpack_int32_from(buf, pos + 1)[0]
    if length < 4 or length > max_size:
        raise ProtocolViolation(f"invalid message length {length} for message type "
                                f"{chr(buf[pos])!r}")
    end = pos + 1 + length
    return end if end <= len(buf) else -1


def declared_end(buf: bytes | bytearray | memoryview, pos: int, max_size: int) -> int:
    """Like frame_end but returns the declared end even when the message is incomplete
    (-1 only when the header itself is incomplete)."""
    if pos + 5 > len(buf):
        return -1
    length = unpack_int32_from(buf, pos + 1)[0]
    if length < 4 or length > max_size:
        raise ProtocolViolation(f"invalid message length {length} for message type "
                                f"{chr(buf[pos])!r}")
    return int(pos + 1 + length)


class MessageReader:
    """Buffers bytes and returns complete messages as (type byte, whole message incl. header)."""

    __slots__ = ("_buf", "max_size")

    def __init__(self, max_size: int = DEFAULT_MAX_MESSAGE) -> None:
        self._buf = bytearray()
        self.max_size = max_size

    def feed(self, data: bytes | bytearray | memoryview) -> list[tuple[int, bytes]]:
        buf = self._buf
        buf += data
        out: list[tuple[int, bytes]] = []
        pos = 0
        while True:
            end = frame_end(buf, pos, self.max_size)
            if end < 0:
                break
            out.append((buf[pos], bytes(buf[pos:end])))
            pos = end
        if pos:
            del buf[:pos]
        return out

    def missing(self, data: bytes | bytearray | memoryview) -> int:
        """How many leading bytes of ``data`` complete the message buffered in part (0: none
        is; all of ``data`` when even they do not). Raises ProtocolViolation for a length
        out of bounds, as :meth:`feed` does."""
        buf = self._buf
        if not buf:
            return 0
        head = bytes(buf[:5]) + bytes(data[:max(0, 5 - len(buf))])
        end = declared_end(head, 0, self.max_size)
        return len(data) if end < 0 else min(len(data), end - len(buf))

    def take_rest(self) -> bytes:
        """The buffered bytes of an incomplete message (and forgets them)."""
        rest = bytes(self._buf)
        self._buf.clear()
        return rest

    @property
    def pending(self) -> int:
        return len(self._buf)


def plain_prefix(buf: bytes, stops: bytes, max_size: int) -> int:
    """Length of the complete messages at the start of ``buf`` whose types are not among
    ``stops``: they can be relayed as they are, without a copy of each. Stops, too, at an
    incomplete message and at a length out of bounds (the caller's reader reports that)."""
    n = len(buf)
    pos = 0
    unpack = unpack_int32_from
    while pos + 5 <= n and buf[pos] not in stops:
        length = unpack(buf, pos + 1)[0]
        end = pos + 1 + length
        if length < 4 or length > max_size or end > n:
            break
        pos = end
    return pos


class BoundaryScanner:
    """Follows message boundaries of a byte stream without buffering or copying it.

    Used on the upstream→client direction of the relay: the caller forwards each chunk
    unchanged and only learns how many ReadyForQuery messages it completed, the last
    transaction status and how many ParameterStatus messages began (``parameters``: a
    setting PostgreSQL reports changed, also by a rollback or inside a function). Cost is
    one header unpack per message; bodies are skipped.
    """

    __slots__ = ("_skip", "_head", "_zpend", "status", "parameters")

    def __init__(self) -> None:
        self._skip = 0          # bytes of the current message body not yet seen
        self._head = b""        # a header split across chunks (< 5 bytes)
        self._zpend = False     # the current (split) message is ReadyForQuery
        self.status = 73        # b"I": last ReadyForQuery status seen
        self.parameters = 0     # ParameterStatus messages begun

    @property
    def at_boundary(self) -> bool:
        return self._skip == 0 and not self._head

    def feed(self, data: bytes | bytearray | memoryview) -> int:
        """Scans ``data``; returns how many ReadyForQuery messages ended in it."""
        n = len(data)
        pos = 0
        count = 0
        if self._head:
            need = 5 - len(self._head)
            if n < need:
                self._head += bytes(data)
                return 0
            head = self._head + bytes(data[:need])
            self._head = b""
            pos = need
            length = unpack_int32_from(head, 1)[0]
            if length < 4:
                raise ProtocolViolation(f"invalid message length {length}")
            self._skip = length - 4
            self._zpend = head[0] == READY_FOR_QUERY
            if head[0] == _PARAMETER_STATUS:
                self.parameters += 1
            if self._skip == 0 and self._zpend:  # pragma: no cover - Z always has a body
                self._zpend = False
        if self._skip:
            take = min(self._skip, n - pos)
            pos += take
            self._skip -= take
            if self._skip:
                return count
            if self._zpend:
                self.status = data[pos - 1]
                self._zpend = False
                count += 1
        while pos + 5 <= n:
            length = unpack_int32_from(data, pos + 1)[0]
            if length < 4:
                raise ProtocolViolation(f"invalid message length {length}")
            end = pos + 1 + length
            typ = data[pos]
            if typ == _PARAMETER_STATUS:
                self.parameters += 1
            if end > n:
                self._skip = end - n
                self._zpend = typ == READY_FOR_QUERY
                return count
            if typ == READY_FOR_QUERY:
                self.status = data[end - 1]
                count += 1
            pos = end
        if pos < n:
            self._head = bytes(data[pos:])
        return count

    def to_boundary(self, data: bytes | bytearray | memoryview) -> int:
        """Consumes ``data`` only up to the end of the message in progress; returns how many
        bytes that took (0 when already at a boundary, len(data) when still inside it)."""
        if self.at_boundary:
            return 0
        if self._head:
            need = 5 - len(self._head)
            if len(data) < need:
                self.feed(data)
                return len(data)
            self.feed(data[:need])
            return need + self.to_boundary(data[need:])
        take = min(self._skip, len(data))
        self.feed(data[:take])
        return take


def read_cstring(buf: bytes, pos: int) -> tuple[str, int]:
    """A NUL-terminated UTF-8 string at ``pos`` and the offset after its terminator."""
    end = buf.find(b"\x00", pos)
    if end < 0:
        raise ProtocolViolation("unterminated string in message")
    try:
        return buf[pos:end].decode(), end + 1
    except UnicodeDecodeError as exc:
        raise ProtocolViolation("invalid UTF-8 string in message") from exc


def cancel_body(pid: int, secret: int) -> bytes:
    return CANCEL_BODY.pack(pid, secret)
