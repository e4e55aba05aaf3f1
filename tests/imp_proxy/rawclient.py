"""A minimal blocking v3 protocol client on a raw socket, for tests that need to see or send
exact bytes (negotiation answers, BackendKeyData, malformed frames, vanishing clients)."""

from __future__ import annotations

import select
import socket
import struct

from imp_proxy.protocol import codec
from imp_proxy.protocol.framing import MessageReader


class RawClient:
    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.reader = MessageReader()
        self.buffered: list[tuple[int, bytes]] = []
        self.key: tuple[int, int] | None = None

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def negotiate(self, code: int) -> bytes:
        """Sends SSLRequest (80877103) / GSSENCRequest (80877104); returns the one-byte answer."""
        self.send(struct.pack("!ii", 8, code))
        return self.sock.recv(1)

    def startup(self, user: str, database: str, **params: str) -> list[tuple[int, bytes]]:
        self.send(codec.encode_startup({"user": user, "database": database, **params}))
        msgs = self.until_ready()
        for typ, msg in msgs:
            if typ == ord("K"):
                k = codec.decode_backend_key_data(msg)
                self.key = (k.pid, k.secret)
        return msgs

    def read(self) -> tuple[int, bytes] | None:
        """The next message, or None when the server closed the connection."""
        while not self.buffered:
            data = self.sock.recv(65536)
            if not data:
                return None
            self.buffered.extend(self.reader.feed(data))
        return self.buffered.pop(0)

    def until_ready(self) -> list[tuple[int, bytes]]:
        out = []
        while True:
            m = self.read()
            if m is None:
                return out
            out.append(m)
            if m[0] in (ord("Z"),):
                return out

    def readable(self, timeout: float) -> bool:
        if self.buffered:
            return True
        r, _, _ = select.select([self.sock], [], [], timeout)
        return bool(r)

    def close(self) -> None:
        self.sock.close()
