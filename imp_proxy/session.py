"""One client connection relayed to one upstream backend.

The relay forwards bytes. Client→upstream it walks message boundaries (it must see Query,
Parse/Bind/…/Sync to count outstanding ReadyForQuery messages and to spot ``IMP`` statements and
sketchable SELECTs); upstream→client it forwards every chunk unchanged and only follows message
boundaries to count ReadyForQuery and remember the transaction status. Only while the proxy
itself talks to the backend (startup/auth, a sketch wrapping, an ``IMP EXPLAIN``) are upstream
messages parsed one by one (``reader`` is set), so that injected replies can be swallowed.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import secrets
from collections import OrderedDict
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from . import admin, databases, intercept
from .errors import UpstreamError
from .local import AdminPortal, LocalAdmin
from .protocol import codec
from .protocol._struct import unpack_int32_from
from .protocol.framing import (
    BoundaryScanner,
    MessageReader,
    ProtocolViolation,
    declared_end,
    decode_startup,
    frame_end,
    plain_prefix,
    split_startup,
)
from .protocol.messages import (
    AUTHENTICATION,
    BACKEND_KEY_DATA,
    BIND,
    CLOSE,
    CLOSE_COMPLETE,
    COPY_DATA,
    DESCRIBE,
    ERROR_RESPONSE,
    EXECUTE,
    FLUSH,
    FUNCTION_CALL,
    NOTICE_RESPONSE,
    NOTIFICATION_RESPONSE,
    PARAMETER_STATUS,
    PARSE,
    PARSE_COMPLETE,
    QUERY,
    READY_FOR_QUERY,
    SYNC,
    TERMINATE,
    CancelRequest,
    GSSENCRequest,
    SSLRequest,
    StartupMessage,
)
from .router import ServiceCancel, prefilter

if TYPE_CHECKING:
    from .server import ProxyServer

log = logging.getLogger(__name__)

_IDLE = 73  # b"I"
_ADMIN_FIRST = frozenset(b"Ii \t\r\n")  # a Query/Parse can only be "IMP …" if it starts so
_EXTENDED = frozenset((PARSE, BIND, DESCRIBE, EXECUTE, CLOSE, FLUSH))
_BLOCK_HOLD = 1
_BLOCK_BACKPRESSURE = 2
MAX_STATEMENT_RECORDS = 256
"""Named statements a session records (``Session.statements``): as many as a driver's
statement cache (pgjdbc 256, psycopg and asyncpg 100)."""
MAX_STATEMENT_CHARS = 1 << 20
"""Characters of statement text a session records."""


_STOPS = bytes((READY_FOR_QUERY, ERROR_RESPONSE))
"""Replies :meth:`Session._relay_plain` leaves to :meth:`Session._replies`."""


def _ends_session(error: bytes) -> bool:
    """An ErrorResponse of severity FATAL or PANIC: PostgreSQL closes the connection after
    it. Why it matters: inside the proxy's own exchanges replies are swallowed, and such an
    error (``pg_terminate_backend`` while a wrapping waits for a lock) never reached the
    client, which saw the connection closed without PostgreSQL's 57P01."""
    fields = codec.decode_error_fields(error).fields
    return fields.get("V", fields.get("S")) in ("FATAL", "PANIC")


class Phase(enum.Enum):
    STARTUP = "startup"
    CONNECTING = "connecting"
    AUTH = "auth"
    READY = "ready"
    ENDING = "ending"   # Terminate sent on: replies to what came before it still relayed
    CLOSED = "closed"


class _Exchange:
    """Replies the proxy awaits for messages it sent itself."""

    __slots__ = ("ready_left", "forward", "skip", "held", "messages", "future")

    def __init__(self, ready: int, forward: int, future: asyncio.Future[list[tuple[int, bytes]]],
                 skip: int = 0, hold: bool = False):
        self.ready_left = ready
        self.forward = forward  # ReadyForQuery messages left before forwarding stops
        self.skip = skip        # CloseComplete/ParseComplete replies kept before forwarding
        # notices held back until the forwarded statement's first other reply (None: not
        # holding): an error with a position before it is kept, not forwarded
        self.held: list[bytes] | None = [] if hold else None
        self.messages: list[tuple[int, bytes]] = []
        self.future = future


class Session(LocalAdmin):
    """State of one client ↔ upstream pair; driven by the two asyncio Protocols in server.py."""

    def __init__(self, server: ProxyServer, client: asyncio.Transport) -> None:
        self.server = server
        self.loop = server.loop
        self.client: asyncio.Transport = client
        self.upstream: asyncio.Transport | None = None
        self.router = server.router
        self.max_message = server.config.max_message_size
        self.phase = Phase.STARTUP
        self.cbuf = bytearray()          # unprocessed client bytes (partial message / held)
        self.cwant = 0                   # cbuf's length before a batch in it is looked at
        self._batch_timer: asyncio.TimerHandle | None = None   # batch_wait's
        self._batch_deadline: float | None = None   # loop time a batch's batch_wait ends
        self.copy_skip = 0               # bytes of a streamed CopyData still to forward
        self.scanner = BoundaryScanner()
        self.reader: MessageReader | None = MessageReader()
        self.exchange: _Exchange | None = None
        self.pending = 0                 # ReadyForQuery messages the client still expects
        self.batch_open = False          # extended-protocol messages forwarded since last Sync
        self.hold = False                # the proxy is busy with an intercepted statement
        self.wrapping = False            # intercept is wrapping a query of the client's
        self.cancelled = False           # a CancelRequest arrived during that wrapping
        self.service_cancel: ServiceCancel | None = None   # reaches the service connection
        self.read_blocks = 0
        self.params: dict[str, str] = {}
        self.tls = False
        self.proxy_key: tuple[int, int] | None = None
        self.upstream_key: tuple[int, int] | None = None
        self.enabled = server.config.sketches
        self.sketching = self.enabled and self.router.hook is not None  # hot-path flag
        # extended-protocol bookkeeping for IMP statements answered locally
        self.local_batch = False
        self.local_error = False
        self.admin_stmts: dict[str, admin.AdminCommand] = {}
        self.admin_portals: dict[str, AdminPortal] = {}
        # named statement -> (sql, parameter type oids, ParameterStatus messages seen) of its
        # last Parse seen, tracked only while sketching is on, for sketch candidates; may be
        # stale (a failed or skipped Parse, DEALLOCATE, DISCARD ALL), so a wrapping checks it
        # against pg_prepared_statements first. Bounded (_remember_statement): the least
        # recently used go
        self.statements: OrderedDict[str, tuple[str, tuple[int, ...], int]] = OrderedDict()
        self._statement_chars = 0        # the recorded texts' total length
        self.tasks: set[asyncio.Task[None]] = set()
        self._shape: intercept.BatchShape | None = None
        # the last Parse text prefilter turned down: drivers parse the same text again and
        # again (unnamed statements), and the comparison is cheaper than the prefilter
        self._plain_parse = b""
        self._tls_done = False
        # a client must complete startup + authentication in time (slowloris, stuck clients)
        self._startup_timer: asyncio.TimerHandle | None = self.loop.call_later(
            server.config.startup_timeout, self._startup_expired)

    # ------------------------------------------------------------------ properties

    @property
    def dbname(self) -> str:
        return self.params.get("database") or self.params.get("user", "")

    @property
    def idle(self) -> bool:
        """Nothing of the client's is in flight upstream."""
        return self.pending == 0 and not self.batch_open

    @property
    def hook_on(self) -> bool:
        return self.sketching

    def set_enabled(self, enabled: bool) -> None:
        """IMP SET enabled = on|off (session scope)."""
        self.enabled = enabled
        self.sketching = enabled and self.router.hook is not None

    # ------------------------------------------------------------------ client side

    def client_data(self, data: bytes) -> None:
        phase = self.phase
        if phase is Phase.READY:
            if self.copy_skip:
                take = min(self.copy_skip, len(data))
                self._up_write(data[:take])
                self.copy_skip -= take
                data = data[take:]
                if not data:
                    return
            if self.hold:
                self.cbuf += data
                return
            if self.cbuf:
                self.cbuf += data
                if len(self.cbuf) < self.cwant:
                    return  # the rest of a batch that may be wrapped (intercept.batch_wanted)
                self._stop_waiting()
                if len(self.cbuf) >= 5 and self.cbuf[0] != COPY_DATA:
                    try:
                        end = declared_end(self.cbuf, 0, self.max_message)
                    except ProtocolViolation as exc:
                        self.fatal(exc.sqlstate, str(exc))
                        return
                    if end > len(self.cbuf):
                        return  # still incomplete: nothing to do until more arrives
                data = bytes(self.cbuf)
                self.cbuf.clear()
            self._process(data)
        elif phase is Phase.AUTH:
            assert self.upstream is not None
            self.upstream.write(data)
        elif phase is Phase.STARTUP:
            self.cbuf += data
            self._startup()
        elif phase is Phase.CONNECTING:
            self.cbuf += data

    def _ending(self) -> None:
        """After the client's Terminate PostgreSQL still answers the messages before it, then
        closes (:meth:`upstream_lost` closes the client); nothing more is read from the
        client. Found: replies to a Query pipelined with its Terminate never reached the
        client, closed at once. A client that closes first ends the upstream too, without
        a cancel (:meth:`close`), as its closed socket would directly."""
        self.phase = Phase.ENDING
        if self.upstream is None:
            self.close()

    def _up_write(self, data: bytes) -> None:
        if self.upstream is not None:
            self.upstream.write(data)

    def _process(self, data: bytes) -> None:
        """Relays complete client messages; intercepts IMP statements and sketchable SELECTs."""
        try:
            self._process_frames(data)
        except ProtocolViolation as exc:
            self.fatal(exc.sqlstate, str(exc))

    def _process_frames(self, data: bytes) -> None:
        n = len(data)
        pos = fwd = 0
        maxsize = self.max_message
        unpack = unpack_int32_from
        while pos < n:
            # inlined frame_end(): this loop is the client→upstream hot path
            end = -1
            if pos + 5 <= n:
                length = unpack(data, pos + 1)[0]
                if length < 4 or length > maxsize:
                    frame_end(data, pos, maxsize)  # raises ProtocolViolation with details
                end = pos + 1 + length
                if end > n:
                    end = -1
            if end < 0:
                if data[pos] == COPY_DATA and pos + 5 <= n:
                    # stream a large CopyData instead of buffering it whole
                    self.copy_skip = declared_end(data, pos, maxsize) - n
                    pos = n
                break
            typ = data[pos]
            if typ == QUERY:
                if (self.admin_stmts or self.admin_portals) and self._query_ends_statements(
                        data[pos + 5:end - 1], self.pending == 0 and not self.batch_open
                        and not self.local_batch):
                    if fwd < pos:
                        self._up_write(data[fwd:pos])
                    pos = fwd = end
                    continue
                if (self.pending == 0 and not self.batch_open and not self.local_batch
                        and end > pos + 5
                        and (self.sketching or data[pos + 5] in _ADMIN_FIRST
                             or databases.mentions_database(data, pos + 5, end))
                        and self._query_special(data, pos, end)):
                    if fwd < pos:
                        self._up_write(data[fwd:pos])
                    self.cbuf += data[end:]
                    return
                self.pending += 1
            elif typ == SYNC:
                if self.local_batch:
                    if fwd < pos:
                        self._up_write(data[fwd:pos])
                    fwd = end
                    self._local_sync()
                else:
                    self.pending += 1
                    self.batch_open = False
            elif typ in _EXTENDED:
                special = (self._extended_special(data, pos, end)
                           if (typ == PARSE or self.local_batch or self.admin_stmts
                               or self.admin_portals
                               or (self.statements and (typ == BIND or typ == CLOSE)))
                           else None)
                if special == "hold":
                    if fwd < pos:
                        self._up_write(data[fwd:pos])
                    self.cbuf += data[end:]
                    return
                elif special == "more":   # the batch from pos on once the rest is here
                    if fwd < pos:
                        self._up_write(data[fwd:pos])
                    self.cbuf += data[pos:]
                    return
                elif special == "local":
                    if fwd < pos:
                        self._up_write(data[fwd:pos])
                    fwd = end
                elif special == "wrap":
                    if fwd < pos:
                        self._up_write(data[fwd:pos])
                    shape, self._shape = self._shape, None
                    assert shape is not None
                    self.cbuf += data[shape.end:]
                    self._run_held(intercept.wrap_batch(self, data[pos:shape.end], shape))
                    return
                elif typ != FLUSH:  # a Flush alone (e.g. after Sync) opens no batch
                    self.batch_open = True
            elif typ == TERMINATE:
                self._up_write(data[fwd:end])
                self._ending()
                return
            elif typ == FUNCTION_CALL:
                self.pending += 1
            pos = end
        if fwd == 0 and pos == n:
            self._up_write(data)
        elif fwd < pos:
            self._up_write(data[fwd:pos])
        if pos < n:
            self.cbuf += data[pos:]

    # ---- simple Query interception

    def _query_special(self, data: bytes, pos: int, end: int) -> bool:
        """Starts intercepting this Query when it is an IMP statement or may be sketched."""
        body = data[pos + 5:end - 1]
        if body[:1] and body[0] in _ADMIN_FIRST and admin.is_admin(body):
            self._run_held(self._admin_query(body))
            return True
        names = self._databases_needed(body) if databases.mentions_database(body) else None
        if names:
            self._run_held(self._release_then_forward(names, bytes(data[pos:end]), query=True))
            return True
        if not self.sketching or self.scanner.status != _IDLE:
            return False
        if not prefilter(body):
            return False
        try:
            sql = body.decode()
        except UnicodeDecodeError:
            return False
        cached = self.router.cached(sql)
        if cached is not None and not cached.candidate:
            return False
        self._run_held(intercept.wrap_query(self, sql, bytes(data[pos:end])))
        return True

    # ---- extended protocol interception

    def _extended_special(self, data: bytes, pos: int, end: int) -> str | None:
        """None: forward. "local": answered here. "hold": async local work started.
        "wrap": the batch starting here is a sketch candidate. "more": it may be one once the
        rest of its bytes are here."""
        typ = data[pos]
        if self.local_batch:
            return self._local_message(bytes(data[pos:end]))
        if typ == PARSE:
            name_end = data.find(b"\x00", pos + 5, end)
            if name_end < 0:
                return None  # PostgreSQL answers a malformed body itself (ERROR, not FATAL)
            if (name_end + 1 < end and data[name_end + 1] in _ADMIN_FIRST
                    and admin.is_admin(data, name_end + 1, end)):
                if self.idle:
                    self.local_batch = True
                    self.local_error = False
                    return self._local_message(bytes(data[pos:end]))
                return None  # in a pipeline: let PostgreSQL report the syntax error
            if self.admin_stmts and self._refuse_parse_of_imp_name(
                    data[pos + 5:name_end].decode(errors="replace"), self.idle):
                return "local"
            names = (self._databases_needed(data[name_end + 1:data.find(b"\x00", name_end + 1,
                                                                         end)])
                     if name_end + 1 < end and data[name_end + 1] in databases.FIRST_BYTES
                     else None)
            if names:
                self._run_held(self._release_then_forward(names, bytes(data[pos:end]),
                                                          query=False))
                return "hold"
            if self.sketching:
                sql_end = data.find(b"\x00", name_end + 1, end)
                text = data[name_end + 1:sql_end]
                if text == self._plain_parse or not prefilter(text):  # most are never sketched
                    self._plain_parse = text
                    if self.statements:
                        self._forget_statement(data[pos + 5:name_end].decode(errors="replace"))
                    return None
                try:
                    msg = codec.decode_parse(bytes(data[pos:end]))
                except ProtocolViolation:
                    return None  # forwarded: PostgreSQL reports the malformed body itself
                if msg.name:  # a Bind of the unnamed statement alone is never wrapped
                    self._remember_statement(msg.name, msg.sql, msg.param_types)
                if self.idle and self.scanner.status == _IDLE:
                    return self._batch_candidate(data, pos, msg.sql)
            return None
        if self.admin_stmts or self.admin_portals:
            if self.admin_portals and self.idle and self.scanner.status == _IDLE:
                self.admin_portals.clear()   # their transaction ended: PostgreSQL's now
            if self.idle and self._refers_to_admin(bytes(data[pos:end])):
                self.local_batch = True
                self.local_error = False
                return self._local_message(bytes(data[pos:end]))
        if typ == BIND and self.sketching and self.idle and self.scanner.status == _IDLE:
            name_end = data.find(b"\x00", pos + 5, end)  # skip the portal name
            stmt_end = data.find(b"\x00", name_end + 1, end)
            stmt = data[name_end + 1:stmt_end].decode(errors="replace")
            known = self.statements.get(stmt)
            if known is not None:
                self.statements.move_to_end(stmt)
                # a setting changed since its Parse: PostgreSQL keeps what the text meant then
                if known[2] == self.scanner.parameters:
                    return self._batch_candidate(data, pos, known[0])
        if typ == CLOSE and self.statements and data[pos + 5] == ord("S"):
            self._forget_statement(codec.decode_close(bytes(data[pos:end])).name)
        return None

    def _remember_statement(self, name: str, sql: str, types: tuple[int, ...]) -> None:
        """Records a named statement's Parse; the least recently used records go beyond
        ``MAX_STATEMENT_RECORDS`` records or ``MAX_STATEMENT_CHARS`` of text. Why bounded: a
        statement dropped by SQL (``DEALLOCATE``, ``DISCARD ALL``: a pooler's reset) stayed
        recorded for the session's life (found: +14 MiB after 4,000 statements of 4 KB
        Parsed and DEALLOCATEd). Recognising those texts exactly is not cheap (comments,
        quoted and case-folded names, several statements in one Query, a ``DEALLOCATE`` run
        by a function); a record dropped only means the statement's Parse-less batches pass
        through, as a stale one is found to (the wrapping checks pg_prepared_statements).

        The record keeps how many ParameterStatus messages the session had seen: a batch
        without a Parse is wrapped only while that count is the same. Why: PostgreSQL reads
        a statement's text under the settings of its Parse, and a wrapping under the current
        ones (found by a regression search in session 25: a statement prepared under
        Pacific/Kiritimati and run after ``RESET TimeZone`` counted 453 rows for 455, and
        one prepared with standard_conforming_strings off read ``'a\\b'`` as two
        backslashes). The session is idle when such a batch is looked at, so every
        ParameterStatus before it has been seen."""
        self._forget_statement(name)
        records = self.statements
        records[name] = (sql, types, self.scanner.parameters)
        self._statement_chars += len(sql)
        while records and (len(records) > MAX_STATEMENT_RECORDS
                           or self._statement_chars > MAX_STATEMENT_CHARS):
            self._statement_chars -= len(records.popitem(last=False)[1][0])

    def _forget_statement(self, name: str) -> None:
        old = self.statements.pop(name, None)
        if old is not None:
            self._statement_chars -= len(old[0])

    def _batch_candidate(self, data: bytes, pos: int, sql: str) -> str | None:
        """"wrap" when the batch starting at ``pos`` is exactly [Parse] Bind [Describe] Execute
        Sync, all in this chunk, for a statement that may be sketched; "more" when this chunk
        ends in what may still become one (:func:`intercept.batch_wanted`; the length wanted
        then in ``cwant``, and between two messages a ``batch_wait`` timer); else None (it
        passes through)."""
        if not prefilter(sql.encode()):
            return None
        cached = self.router.cached(sql)
        if cached is not None and not cached.candidate:
            return None
        shape = intercept.batch_shape(data, pos, self.max_message, self.statements)
        if shape is not None:
            self._batch_deadline = None
            self._shape = shape
            return "wrap"
        wanted, inside = intercept.batch_wanted(data, pos, self.max_message)
        if wanted and not inside:   # one batch_wait per batch, however many gaps it has
            now = self.loop.time()
            if self._batch_deadline is None:
                self._batch_deadline = now + self.server.config.batch_wait
            left = self._batch_deadline - now
            if left > 0:
                self._batch_timer = self.loop.call_later(left, self._waited_enough)
            else:
                wanted = 0
        if not wanted:
            self._batch_deadline = None
            return None
        self.cwant = wanted - pos
        return "more"

    def _waited_enough(self) -> None:
        """``batch_wait`` (configuration) passed without the rest of a batch whose bytes ended
        between two messages: it goes on as it is, unwrapped. (A batch whose bytes end inside
        a message waits for the rest as long as it takes: its sender is still sending.)"""
        self._batch_timer = None
        if self.phase is not Phase.READY or self.hold or not self.cwant or not self.cbuf:
            return
        self.cwant = 0
        self._batch_deadline = 0.0   # passed, whatever the clock's resolution
        data = bytes(self.cbuf)
        self.cbuf.clear()
        self._process(data)

    def _stop_waiting(self) -> None:
        self.cwant = 0
        if self._batch_timer is not None:
            self._batch_timer.cancel()
            self._batch_timer = None

    # ---- statements that need a database to themselves (imp_proxy.databases)

    def _databases_needed(self, text: bytes) -> frozenset[str]:
        """The databases ``text`` needs to itself, where the proxy holds sessions at all."""
        if self.router.pools is None:
            return frozenset()
        return databases.databases_named(text)

    async def _release_then_forward(self, names: frozenset[str], raw: bytes,
                                    query: bool) -> None:
        """Lets go of the databases ``names``, then sends the statement (a Query, or the Parse
        of a batch whose other messages follow from ``cbuf``) as it came."""
        await self.router.release_databases(names)
        if query:
            self.pending += 1
        else:
            self.batch_open = True
        self._up_write(raw)

    # ---- holding the client while the proxy works

    def _run_held(self, coro: Coroutine[Any, Any, None]) -> None:
        self.hold = True
        self.block_client(_BLOCK_HOLD)
        task = self.loop.create_task(self._held(coro))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _held(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except (UpstreamError, ConnectionError) as exc:
            log.warning("session aborted: %s", exc)
            self.fatal("08006", f"IMP proxy lost the upstream connection: {exc}")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug must not hang the client: report and close
            log.exception("internal error in session")
            self.fatal("XX000", f"IMP proxy internal error: {exc}")
        finally:
            self.hold = False
            self.unblock_client(_BLOCK_HOLD)
            if self.phase is Phase.READY and self.cbuf:
                data = bytes(self.cbuf)
                self.cbuf.clear()
                self.client_data(data)

    # ---- talking to the backend on the client's connection (used by intercept.py)

    def cancel_requested(self) -> None:
        """The client sent a CancelRequest. While the proxy wraps a query (``wrapping``),
        the backend mostly waits idle in the proxy's transaction, where PostgreSQL ignores a
        cancel: ``cancelled`` tells the wrapping to answer it (``intercept``), and the
        service connection preparing the query is cancelled too (:class:`ServiceCancel`)."""
        if self.wrapping:
            self.cancelled = True
            self.cancel_service()

    def cancel_service(self) -> None:
        """Interrupts the wrapping's work on a service connection, if it went to one."""
        if self.service_cancel is not None:
            self._spawn(asyncio.to_thread(self.service_cancel.cancel))

    def new_service_cancel(self) -> ServiceCancel:
        """The :class:`ServiceCancel` of the wrapping's prepare, made when it goes to a
        service connection (not per query: most are answered from memory); one made after
        the client's cancel stops that prepare before it starts."""
        self.service_cancel = cancel = ServiceCancel()
        if self.cancelled:
            cancel.requested.set()
        return cancel

    def enter_parse_mode(self) -> None:
        self.reader = MessageReader()

    def leave_parse_mode(self) -> None:
        reader, self.reader = self.reader, None
        if reader is not None and reader.pending:
            rest = reader.take_rest()
            if not self.client.is_closing():   # uvloop raises on a closed transport
                self.client.write(rest)
            self.scanner.feed(rest)

    async def exchange_with_upstream(self, payload: bytes, ready: int, forward: int = 0,
                                     skip: int = 0, hold: bool = False
                                     ) -> list[tuple[int, bytes]]:
        """Sends ``payload`` upstream and collects replies up to the ``ready``-th ReadyForQuery.

        Replies are returned (swallowed) except asynchronous NotificationResponse and
        ParameterStatus, which go to the client, and except the replies before the
        ``forward``-th ReadyForQuery: those, but the ReadyForQuery, are forwarded to the
        client as they arrive — once ``skip`` CloseComplete/ParseComplete replies (of
        messages the proxy put first) were returned. An ErrorResponse among those stops all
        forwarding. ``hold``: an ErrorResponse with a position (an error in the SQL text: the
        position counts in the proxy's text, not the client's) that comes before any other
        forwarded reply but notices is returned instead, and stops all forwarding.
        """
        if self.upstream is None or self.upstream.is_closing():
            raise UpstreamError("upstream connection is closed")
        assert self.reader is not None and self.exchange is None
        fut: asyncio.Future[list[tuple[int, bytes]]] = self.loop.create_future()
        self.exchange = _Exchange(ready, forward, fut, skip, hold)
        self.upstream.write(payload)
        return await fut

    # ------------------------------------------------------------------ upstream side

    def upstream_data(self, data: bytes) -> None:
        reader = self.reader
        if reader is None:
            self.client.write(data)
            try:
                c = self.scanner.feed(data)
            except ProtocolViolation as exc:
                self.fatal("08P01", f"invalid message from upstream: {exc}")
                return
            if c:
                self.pending -= c
            return
        if not self.scanner.at_boundary:  # finish an async message already being forwarded
            k = self.scanner.to_boundary(data)
            self.client.write(data[:k])
            data = data[k:]
        try:
            if self.phase is not Phase.AUTH:
                data = self._relay_plain(reader, data)
            msgs = reader.feed(data)
        except ProtocolViolation as exc:
            self.fatal("08P01", f"invalid message from upstream: {exc}")
            return
        if self.phase is Phase.AUTH:
            self._auth_messages(msgs)
            return
        self._replies(msgs)

    def _relay_plain(self, reader: MessageReader, data: bytes) -> bytes:
        """While an exchange forwards a statement's replies as they are (no reply skipped or
        held): relays the complete replies at the start of ``data`` up to the first
        ReadyForQuery or ErrorResponse in one write, without taking each apart, and returns
        the rest for ``reader``. A reply begun in an earlier chunk is completed through the
        reader first. Why: each reply taken apart, copied and joined again cost about
        2 µs, so a sketched query's 500,000 rows took 1.1 s longer through the proxy than
        unwrapped (session 30)."""
        if not self._forwarding_as_is():
            return data
        done = reader.missing(data)
        if done:
            self._replies(reader.feed(data[:done]))
            data = data[done:]
            if not data or not self._forwarding_as_is():
                return data
        k = plain_prefix(data, _STOPS, self.max_message)
        if not k:
            return data
        self.client.write(data[:k])
        return data[k:]

    def _forwarding_as_is(self) -> bool:
        """Does an exchange forward the upstream's replies now, none skipped or held?"""
        ex = self.exchange
        return ex is not None and bool(ex.forward) and not ex.skip and ex.held is None

    def _replies(self, msgs: list[tuple[int, bytes]]) -> None:
        """Upstream replies taken apart (``reader``): to the client, to the exchange awaiting
        them, or both (see :meth:`exchange_with_upstream`)."""
        out: list[bytes] = []
        ex = self.exchange
        for typ, msg in msgs:
            if ex is None:
                out.append(msg)
            elif typ == ERROR_RESPONSE and _ends_session(msg):
                out.append(msg)   # the backend ends the session: the client hears why
                ex.messages.append((typ, msg))
                ex.skip = ex.forward = 0
                ex.held = None
            elif typ == READY_FOR_QUERY:
                ex.messages.append((typ, msg))
                ex.ready_left -= 1
                if ex.forward:
                    ex.forward -= 1
                    if ex.held:   # notices only: nothing else to wait for
                        out.extend(ex.held)
                    ex.held = None
                if ex.ready_left == 0:
                    self.scanner.status = msg[5]
                    self.exchange = None
                    if not ex.future.done():
                        ex.future.set_result(ex.messages)
                    ex = None
            elif ex.skip and typ not in (NOTIFICATION_RESPONSE, PARAMETER_STATUS):
                ex.messages.append((typ, msg))
                if typ == ERROR_RESPONSE:
                    ex.skip = ex.forward = 0
                elif typ in (CLOSE_COMPLETE, PARSE_COMPLETE):
                    ex.skip -= 1
            elif ex.held is not None and ex.forward and typ not in (NOTIFICATION_RESPONSE,
                                                                    PARAMETER_STATUS):
                self._held_reply(ex, typ, msg, out)
            elif ex.forward or typ in (NOTIFICATION_RESPONSE, PARAMETER_STATUS):
                out.append(msg)
            else:
                ex.messages.append((typ, msg))
        if out:
            self.client.write(b"".join(out))

    @staticmethod
    def _held_reply(ex: _Exchange, typ: int, msg: bytes, out: list[bytes]) -> None:
        """One reply of a statement whose first replies are held (``exchange_with_upstream``)."""
        assert ex.held is not None
        if typ == NOTICE_RESPONSE:
            ex.held.append(msg)
            return
        if typ == ERROR_RESPONSE and "P" in codec.decode_error_fields(msg).fields:
            ex.messages.append((typ, msg))
            ex.forward = 0
            ex.held = None
            return
        out.extend(ex.held)
        out.append(msg)
        ex.held = None

    def _auth_messages(self, msgs: list[tuple[int, bytes]]) -> None:
        out: list[bytes] = []
        ready = False
        for typ, msg in msgs:
            if typ == AUTHENTICATION:
                msg = codec.strip_channel_binding(msg)
            elif typ == BACKEND_KEY_DATA:
                key = codec.decode_backend_key_data(msg)
                self.upstream_key = (key.pid, key.secret)
                # same pid (pg_backend_pid() and NOTIFY pids stay meaningful), own secret
                self.proxy_key = (key.pid, secrets.randbits(31))
                self.server.register_cancel_key(self.proxy_key, self.upstream_key,
                                                self.cancel_requested)
                msg = codec.encode_backend_key_data(*self.proxy_key)
            elif typ == READY_FOR_QUERY:
                ready = True
                self.scanner.status = msg[5]
            out.append(msg)
        self.client.write(b"".join(out))
        if ready:
            self.phase = Phase.READY
            self._cancel_startup_timer()
            self.router.count("connections")
            self.leave_parse_mode()
            if self.cbuf:
                data = bytes(self.cbuf)
                self.cbuf.clear()
                self.client_data(data)

    def upstream_lost(self, exc: Exception | None) -> None:
        self.upstream = None
        ex, self.exchange = self.exchange, None
        if ex is not None and not ex.future.done():
            ex.future.set_exception(UpstreamError(f"upstream closed: {exc}"))
        if self.phase is not Phase.CLOSED:
            self.phase = Phase.CLOSED
            self.client.close()
        self._forget_key()

    # ------------------------------------------------------------------ startup

    def _startup(self) -> None:
        try:
            while self.phase is Phase.STARTUP:
                packet, length = split_startup(self.cbuf)
                if packet is None:
                    return
                del self.cbuf[:length]
                msg = decode_startup(packet)
                if isinstance(msg, SSLRequest):
                    if self.server.ssl_context is not None and not self.tls:
                        self.client.write(b"S")
                        self.tls = True
                        self._spawn(self._start_tls())
                        return
                    self.client.write(b"N")
                elif isinstance(msg, GSSENCRequest):
                    self.client.write(b"N")
                elif isinstance(msg, CancelRequest):
                    self.phase = Phase.CLOSED
                    self._spawn(self._cancel_then_close(msg.pid, msg.secret))
                    return
                elif isinstance(msg, StartupMessage):
                    self.params = dict(msg.params)
                    self.phase = Phase.CONNECTING
                    self._spawn(self._connect(msg.raw))
        except ProtocolViolation as exc:
            self.fatal(exc.sqlstate, str(exc))

    async def _cancel_then_close(self, pid: int, secret: int) -> None:
        """Forwards a CancelRequest, then closes the client's cancel connection. Why in this
        order: libpq's cancel returns when the server closes that connection, which
        PostgreSQL does after signalling the backend; closed first, the cancel landed later
        and aborted the client's next query (found with psycopg2)."""
        try:
            await self.server.forward_cancel(pid, secret)
        finally:
            self.client.close()

    async def _start_tls(self) -> None:
        assert self.server.ssl_context is not None
        try:
            protocol = self.client.get_protocol()
            new = await self.loop.start_tls(self.client, protocol, self.server.ssl_context,
                                            server_side=True)
        except (OSError, ConnectionError) as exc:
            log.info("TLS handshake with client failed: %s", exc)
            self.phase = Phase.CLOSED
            self.client.close()
            return
        if new is None:
            self.phase = Phase.CLOSED
            return
        self.client = new
        self._tls_done = True
        if self.cbuf:
            self._startup()

    async def _connect(self, startup: bytes) -> None:
        try:
            self.upstream = await self.server.connect_upstream(self)
        except (OSError, TimeoutError) as exc:
            self.fatal("08006", f"IMP proxy could not connect to the upstream server: {exc}")
            return
        if self.phase is not Phase.CONNECTING:  # client went away meanwhile
            self.upstream.close()
            return
        self.phase = Phase.AUTH
        self.upstream.write(startup)
        if self.cbuf:
            data = bytes(self.cbuf)
            self.cbuf.clear()
            self.upstream.write(data)

    def _startup_expired(self) -> None:
        self._startup_timer = None
        if self.phase not in (Phase.STARTUP, Phase.CONNECTING, Phase.AUTH):
            return
        timeout = self.server.config.startup_timeout
        log.info("client did not complete startup within %.1f s", timeout)
        if self.tls and not self._tls_done:  # mid-handshake: no way to send a message
            self.close()
            return
        self.fatal("08P01", f"startup and authentication not completed within {timeout:g} s")

    def _cancel_startup_timer(self) -> None:
        if self._startup_timer is not None:
            self._startup_timer.cancel()
            self._startup_timer = None

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # ------------------------------------------------------------------ flow control & end

    def block_client(self, why: int) -> None:
        if not self.read_blocks:
            self.client.pause_reading()
        self.read_blocks |= why

    def unblock_client(self, why: int) -> None:
        if self.read_blocks:
            self.read_blocks &= ~why
            if not self.read_blocks and not self.client.is_closing():
                self.client.resume_reading()

    def client_pause_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.pause_reading()

    def client_resume_writing(self) -> None:
        if self.upstream is not None and not self.upstream.is_closing():
            self.upstream.resume_reading()

    def upstream_pause_writing(self) -> None:
        self.block_client(_BLOCK_BACKPRESSURE)

    def upstream_resume_writing(self) -> None:
        self.unblock_client(_BLOCK_BACKPRESSURE)

    def fatal(self, sqlstate: str, message: str) -> None:
        """Sends a FATAL ErrorResponse to this client and ends the session."""
        log.info("closing session with FATAL %s: %s", sqlstate, message)
        if not self.client.is_closing():
            self.client.write(codec.encode_error("FATAL", sqlstate, message))
        self.close()

    def close(self) -> None:
        """Ends both legs; an upstream still busy for this client is cancelled first."""
        if self.phase is Phase.CLOSED and self.upstream is None:
            self.client.close()
            return
        self._cancel_startup_timer()
        self._stop_waiting()
        busy = self.phase is Phase.READY and (self.pending > 0 or self.hold or self.batch_open)
        self.phase = Phase.CLOSED
        self.client.close()
        up, self.upstream = self.upstream, None
        if up is not None:
            if busy and self.upstream_key is not None:
                self._spawn(self.server.send_cancel(*self.upstream_key))
            if not up.is_closing():
                up.write(codec.encode_terminate())
            up.close()
        self._forget_key()

    def shut_down(self) -> None:
        """The proxy stops: the client first gets what PostgreSQL's fast shutdown sends
        (``FATAL 57P01``), then :meth:`close` (found by a helper's search: the connection
        just closed, "server closed the connection unexpectedly")."""
        if self.phase is Phase.READY and not self.client.is_closing():
            self.client.write(codec.encode_error(
                "FATAL", "57P01", "terminating connection due to administrator command"))
        self.close()

    def client_lost(self) -> None:
        self.close()

    def _forget_key(self) -> None:
        if self.proxy_key is not None:
            self.server.unregister_cancel_key(self.proxy_key)
            self.proxy_key = None
