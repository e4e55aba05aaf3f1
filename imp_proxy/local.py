"""IMP statements answered by the proxy on the client's connection (session mixin).

A simple ``Query`` with an IMP statement is answered whole. In the extended protocol, a batch
that starts with an IMP statement while nothing is in flight upstream is a *local batch*: its
Parse/Bind/Describe/Execute/Close of IMP statements are answered here, an error discards until
Sync (as PostgreSQL does), the Sync gets a ReadyForQuery with the upstream's last status, and
the first non-IMP message hands the rest of the batch to the upstream (every local reply was
already written, so the order the client sees stays right).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import admin, intercept
from .protocol import codec
from .protocol.framing import ProtocolViolation, read_cstring
from .protocol.messages import BIND, CLOSE, DESCRIBE, EXECUTE, FLUSH, PARSE

if TYPE_CHECKING:
    from .protocol.framing import BoundaryScanner


@dataclass(slots=True)
class AdminPortal:
    """A bound IMP statement. Run by its first Execute; ``rows`` then holds the DataRows not
    sent yet (an Execute with a row limit sends that many and PortalSuspended, as PostgreSQL
    does), and a statement without rows cannot be run again (55000, as PostgreSQL's
    utility statements)."""

    cmd: admin.AdminCommand
    formats: tuple[int, ...]
    rows: list[bytes] | None = None
    tag: str = ""


_IDLE = ord("I")


class LocalAdmin:
    """Mixin of Session: the state and handlers of locally answered IMP statements."""

    client: asyncio.Transport
    scanner: BoundaryScanner
    batch_open: bool
    local_batch: bool
    local_error: bool
    admin_stmts: dict[str, admin.AdminCommand]
    admin_portals: dict[str, AdminPortal]

    def _extended_special(self, data: bytes, pos: int, end: int) -> str | None:
        raise NotImplementedError

    def _run_held(self, coro: Coroutine[Any, Any, None]) -> None:
        raise NotImplementedError

    def _local_message(self, msg: bytes) -> str | None:
        """Answers one message of a local (IMP) batch; a non-IMP message ends local mode."""
        typ = msg[0]
        if self.local_error:
            return "local"  # discard until Sync, as PostgreSQL does after an error
        if typ == PARSE:
            try:
                p = codec.decode_parse(msg)
            except ProtocolViolation:
                return self._leave_local(msg)   # PostgreSQL reports the malformed body
            if not admin.is_admin(p.sql.encode()):
                return self._leave_local(msg)
            try:
                self.admin_stmts[p.name] = admin.parse_admin(p.sql)
            except admin.AdminError as exc:
                self._local_fail(exc)
                return "local"
            self.client.write(codec.parse_complete())
            return "local"
        if typ == FLUSH:
            return "local"
        if not self._refers_to_admin(msg):
            return self._leave_local(msg)
        if typ == BIND:
            try:
                b = codec.decode_bind(msg)
            except ProtocolViolation:
                self._local_fail(admin.AdminError("08P01", "invalid message format"))
                return "local"
            if b.params:
                self._local_fail(admin.AdminError(
                    "08P01", "IMP statements take no parameters"))
                return "local"
            width = len(self.admin_stmts[b.statement].columns or ())
            if len(b.result_formats) > 1 and len(b.result_formats) != width:
                # PostgreSQL's own check (found by a regression search in session 26: the
                # Describe after such a Bind raised IndexError and closed the connection)
                self._local_fail(admin.AdminError(
                    "08P01", f"bind message has {len(b.result_formats)} result formats but "
                    f"query has {width} columns"))
                return "local"
            self.admin_portals[b.portal] = AdminPortal(self.admin_stmts[b.statement],
                                                       b.result_formats)
            self.client.write(codec.bind_complete())
        elif typ == DESCRIBE:
            d = codec.decode_describe(msg)
            if d.kind == "S":
                cols = self.admin_stmts[d.name].columns
                out = codec.encode_parameter_description(())
                out += admin.row_description(cols) if cols is not None else codec.no_data()
            else:
                portal = self.admin_portals[d.name]
                cols = portal.cmd.columns
                out = (admin.row_description(cols, portal.formats) if cols is not None
                       else codec.no_data())
            self.client.write(out)
        elif typ == CLOSE:
            c = codec.decode_close(msg)
            (self.admin_stmts if c.kind == "S" else self.admin_portals).pop(c.name, None)
            self.client.write(codec.close_complete())
        elif typ == EXECUTE:
            e = codec.decode_execute(msg)
            portal = self.admin_portals[e.portal]
            if portal.rows is None:
                self._run_held(self._admin_execute(e.portal, portal, e.max_rows))
                return "hold"
            self._send_rows(e.portal, portal, e.max_rows, again=True)
        return "local"

    def _leave_local(self, msg: bytes) -> str | None:
        """A non-IMP message in a local batch: from here on the batch goes upstream (the local
        replies already sent precede every upstream reply, so the order stays right)."""
        self.local_batch = False
        self.batch_open = True
        return self._extended_special(msg, 0, len(msg))

    def _local_fail(self, exc: admin.AdminError) -> None:
        self.client.write(codec.encode_error("ERROR", exc.sqlstate, exc.message))
        self.local_error = True

    def _local_sync(self) -> None:
        self.local_batch = False
        self.local_error = False
        if self.scanner.status == _IDLE:   # the implicit transaction ends with its portals
            self.admin_portals.clear()
        self.client.write(codec.encode_ready_for_query(chr(self.scanner.status)))

    async def _admin_query(self, body: bytes) -> None:
        try:
            cmd = admin.parse_admin(body.decode())
            result = await intercept.run_admin(self, cmd)  # type: ignore[arg-type]
            out = admin.encode_result(result)
        except admin.AdminError as exc:
            out = codec.encode_error("ERROR", exc.sqlstate, exc.message)
        except UnicodeDecodeError:
            out = codec.encode_error("ERROR", "22021", "invalid UTF-8 in IMP statement")
        self.client.write(out + codec.encode_ready_for_query(chr(self.scanner.status)))

    async def _admin_execute(self, name: str, portal: AdminPortal, max_rows: int) -> None:
        try:
            result = await intercept.run_admin(self, portal.cmd)  # type: ignore[arg-type]
        except admin.AdminError as exc:
            self._local_fail(exc)
            return
        portal.rows, portal.tag = admin.data_rows(result), result.tag
        self._send_rows(name, portal, max_rows, again=False)

    def _send_rows(self, name: str, portal: AdminPortal, max_rows: int, again: bool) -> None:
        """Up to ``max_rows`` (0: all) of the portal's rows not sent yet, then PortalSuspended
        or CommandComplete (``SELECT n`` counting this Execute's rows, as PostgreSQL counts
        them); a statement without rows run ``again`` fails as PostgreSQL's do."""
        if portal.cmd.columns is None and again:
            self._local_fail(admin.AdminError("55000", f'portal "{name}" cannot be run'))
            return
        rows = portal.rows or []
        if 0 < max_rows < len(rows):
            portal.rows = rows[max_rows:]
            self.client.write(b"".join([*rows[:max_rows], codec.portal_suspended()]))
            return
        portal.rows = []
        tag = f"SELECT {len(rows)}" if portal.tag.startswith("SELECT ") else portal.tag
        self.client.write(b"".join([*rows, codec.encode_command_complete(tag)]))

    def _refers_to_admin(self, msg: bytes) -> bool:
        typ = msg[0]
        if typ == BIND:   # the names only: a malformed body is PostgreSQL's to report
            try:
                _portal, pos = read_cstring(msg, 5)
                return read_cstring(msg, pos)[0] in self.admin_stmts
            except ProtocolViolation:
                return False
        if typ in (DESCRIBE, CLOSE):
            kind, name = chr(msg[5]), msg[6:-1].decode(errors="replace")
            table: dict[str, Any] = self.admin_stmts if kind == "S" else self.admin_portals
            return name in table
        if typ == EXECUTE:
            return codec.decode_execute(msg).portal in self.admin_portals
        return False

