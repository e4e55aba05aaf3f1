"""A real TCP forwarder between the proxy and PostgreSQL that can hold the proxy's stream
back just before a chosen Parse message: a network or scheduling delay between two of the
wrapping's pipelined messages, made exact, so a peer's commit lands in that window."""

from __future__ import annotations

import socket
import struct
import threading

_PROTOCOL_3 = 196608


class PausingForwarder:
    """Listens on 127.0.0.1 (``port``) and forwards every connection to ``host``:``port``.
    After :meth:`arm` the next Parse whose text holds all of ``marker`` waits, with every
    byte before it already sent, until :meth:`release` (``paused`` is set meanwhile)."""

    def __init__(self, host: str, port: int, marker: tuple[bytes, ...]) -> None:
        self.marker = marker
        self.target = (host, port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.server.getsockname()[1]
        self.armed = threading.Event()
        self.paused = threading.Event()
        self.resume = threading.Event()
        self._sockets: list[socket.socket] = [self.server]
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self) -> None:
        self.paused.clear()
        self.resume.clear()
        self.armed.set()

    def release(self) -> None:
        self.resume.set()

    def close(self) -> None:
        self.resume.set()
        for s in self._sockets:
            try:
                s.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
                upstream = socket.create_connection(self.target)
            except OSError:
                return
            self._sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()
            threading.Thread(target=self._up, args=(client, upstream), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _shut(src, dst)

    def _up(self, client: socket.socket, upstream: socket.socket) -> None:
        """Client to server, whole messages: the startup packet, then typed messages."""
        buf, started = b"", False
        try:
            while data := client.recv(65536):
                buf += data
                while True:
                    if not started:
                        if len(buf) < 8 or len(buf) < struct.unpack_from("!I", buf)[0]:
                            break
                        n = struct.unpack_from("!I", buf)[0]
                        started = struct.unpack_from("!I", buf, 4)[0] == _PROTOCOL_3
                        upstream.sendall(buf[:n])
                        buf = buf[n:]
                        continue
                    if len(buf) < 5 or len(buf) < 1 + struct.unpack_from("!I", buf, 1)[0]:
                        break
                    n = 1 + struct.unpack_from("!I", buf, 1)[0]
                    message, buf = buf[:n], buf[n:]
                    if message[:1] == b"P" and self.armed.is_set() \
                            and all(m in message for m in self.marker):
                        self.armed.clear()
                        self.paused.set()
                        self.resume.wait(30)
                    upstream.sendall(message)
        except OSError:
            pass
        finally:
            _shut(client, upstream)


def _shut(*sockets: socket.socket) -> None:
    for s in sockets:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
