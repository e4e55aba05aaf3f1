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

import pglast
from pglast import ast
from pglast.enums import DiscardMode

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
_FAILED = ord("E")


def _exists(name: str) -> admin.AdminError:
    return admin.AdminError("42P05", f'prepared statement "{name}" already exists')


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
                cmd = admin.parse_admin(p.sql)
            except admin.AdminError as exc:
                self._local_fail(exc)
                return "local"
            if self.scanner.status == _FAILED:   # PostgreSQL's refusals, in its order
                self._local_fail(admin.AdminError("25P02", intercept.ABORTED))
            elif p.name in self.admin_stmts and p.name:
                self._local_fail(_exists(p.name))
            elif p.name:
                self._run_held(self._parse_named(p.name, cmd))
                return "hold"
            else:
                self.admin_stmts[p.name] = cmd
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

    def _query_ends_statements(self, body: bytes, answerable: bool) -> bool:
        """A simple Query while IMP statements or portals exist ends them as PostgreSQL would
        its own: every Query the unnamed ones, ``DEALLOCATE ALL`` and ``DISCARD ALL`` (run
        first, outside a failed transaction; DISCARD ALL outside a transaction block) all of
        them. A Query that is just ``DEALLOCATE name`` of an IMP statement is answered here
        when ``answerable`` (nothing in flight upstream): True then. Why: psycopg with a
        libpq before 17 drops a statement evicted from its cache by SQL ``DEALLOCATE``, which
        PostgreSQL refused for an IMP statement, and psycopg raised that at the app's next,
        unrelated query (found by a helper's search, as were Binds of IMP statements that
        a ``DEALLOCATE ALL``, a ``DISCARD ALL`` or a Query had ended)."""
        self.admin_stmts.pop("", None)
        self.admin_portals.pop("", None)
        status = self.scanner.status
        if not self.admin_stmts or status == _FAILED:
            return False
        try:
            stmts = pglast.parse_sql(body.decode())
        except (pglast.parser.ParseError, UnicodeDecodeError, ValueError):
            return False   # PostgreSQL reports it
        first = stmts[0].stmt if stmts else None
        if isinstance(first, ast.DeallocateStmt) and first.name is None:
            self.admin_stmts.clear()
        elif (isinstance(first, ast.DiscardStmt) and first.target == DiscardMode.DISCARD_ALL
                and len(stmts) == 1 and status == _IDLE):
            self.admin_stmts.clear()
            self.admin_portals.clear()
        elif (answerable and len(stmts) == 1 and isinstance(first, ast.DeallocateStmt)
                and first.name in self.admin_stmts):
            del self.admin_stmts[first.name]
            self.client.write(codec.encode_command_complete("DEALLOCATE")
                              + codec.encode_ready_for_query(chr(status)))
            return True
        return False

    async def _parse_named(self, name: str, cmd: admin.AdminCommand) -> None:
        """A named IMP statement, unless the client's session already has a statement of that
        name, as PostgreSQL refuses it (found by a regression search: the IMP statement
        replaced the client's own, and its Binds ran the IMP statement)."""
        if await intercept.statement_exists(self, name):  # type: ignore[arg-type]
            self._local_fail(_exists(name))
            return
        self.admin_stmts[name] = cmd
        self.client.write(codec.parse_complete())

    def _refuse_parse_of_imp_name(self, name: str, idle: bool) -> bool:
        """A Parse of an ordinary statement named as an IMP statement: PostgreSQL's 42P05 and
        the batch discarded up to its Sync, when this Parse starts a batch (``idle``: nothing
        in flight) outside a transaction block (True); else False, and it goes upstream
        (which does not know the name) and ends the IMP statement."""
        if not (idle and name and name in self.admin_stmts and self.scanner.status == _IDLE):
            self.admin_stmts.pop(name, None)
            return False
        self.local_batch = True
        self.local_error = False
        self._local_fail(_exists(name))
        return True

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

