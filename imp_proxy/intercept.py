"""What the proxy does on the client's backend when it intercepts a statement.

* ``wrap_query`` / ``wrap_batch``: the sketch wrapping of docs/INTERFACES.md §2 for a simple
  Query and for an extended-protocol ``[Parse] Bind [Describe] Execute Sync`` batch;
* ``run_admin``: the ``IMP …`` statements (``IMP EXPLAIN`` uses the same snapshot steps).

All of this runs while the session holds the client (no other client message is processed),
and only when the backend was idle (status I, nothing in flight), so every reply up to the
next ReadyForQuery belongs to the proxy or to the one statement it is wrapping.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING

from sketches.lookup import EFFECTIVE_SEARCH_PATH, SERVER_INSTANCE
from sketches.typeoids import (
    BOOL,
    FLOAT4,
    FLOAT8,
    INT2,
    INT4,
    INT8,
    INTEGERS,
    NUMERIC,
    TEXT,
    TEXT_LIKE,
)

from . import admin
from .errors import UpstreamError
from .protocol import codec
from .protocol._struct import FLOAT8 as FLOAT8_BYTES
from .protocol._struct import INT16 as INT16_BYTES
from .protocol._struct import INT32 as INT32_BYTES
from .protocol._struct import INT64 as INT64_BYTES
from .protocol._struct import unpack_array_from, unpack_uint16_from
from .protocol.binary_text import text_of_binary
from .protocol.framing import ProtocolViolation, declared_end, frame_end
from .protocol.messages import (
    BINARY_FORMAT,
    BIND,
    BIND_COMPLETE,
    CLOSE_COMPLETE,
    DATA_ROW,
    DESCRIBE,
    ERROR_RESPONSE,
    EXECUTE,
    PARAMETER_DESCRIPTION,
    PARSE,
    PARSE_COMPLETE,
    READY_FOR_QUERY,
    SYNC,
    Bind,
    Execute,
    Parse,
)
from .router import SESSION_SETTINGS, Decision, PrepareOutcome, ServiceError, setting_sql

if TYPE_CHECKING:
    from .session import Session

log = logging.getLogger(__name__)

# The search_path is read as the client's session resolves it (lookup.EFFECTIVE_SEARCH_PATH):
# its text ("$user", public) would name another role's schemas on the service connection.
# idle_in_transaction_session_timeout is off for the wrapping: the client's backend waits in
# it while a service connection prepares (a capture can take seconds), and a client timeout
# shorter than that ended the session (found: FATAL 25P03 where PostgreSQL ran the query).
# Every function, operator and type qualified: it runs on the client's search path, where a
# schema of its own may hold a same-named function (found by a helper's regression search).
BEGIN_SNAPSHOT = ("BEGIN ISOLATION LEVEL REPEATABLE READ",
                  "SELECT pg_catalog.pg_export_snapshot(), "
                  + EFFECTIVE_SEARCH_PATH + ", pg_catalog.pg_current_snapshot()::pg_catalog.text"
                  + "".join(f", {setting_sql(n)}" for n in SESSION_SETTINGS)
                  + ", pg_catalog.current_setting('default_transaction_isolation')"
                  " OPERATOR(pg_catalog.=) 'serializable', "
                  + SERVER_INSTANCE + ", pg_catalog.pg_client_encoding(),"
                  " extract(epoch FROM pg_catalog.current_setting('statement_timeout')"
                  "::pg_catalog.interval)::pg_catalog.float8,"
                  " pg_catalog.current_setting('lock_timeout'),"
                  " pg_catalog.set_config('idle_in_transaction_session_timeout', '0', true),"
                  " current_user, pg_catalog.current_setting('backslash_quote')"
                  " OPERATOR(pg_catalog.=) 'off'")
# Read before anything of the proxy's own can fail on the client's backend: exit_on_error
# makes every ERROR there FATAL (found: the wrapping's LOCK … NOWAIT, failing behind another
# session's lock, ended a session that PostgreSQL kept waiting for the lock). It stays off
# for the rest of the proxy's transaction, whose ROLLBACK restores it. SHOW and SET, not a
# SELECT: they take no snapshot, so the LOCK after them still comes before the transaction's
# snapshot (found by a helper's search: a SELECT here fixed the snapshot first, and a TRUNCATE
# and refill committed before the LOCK was granted left the query an empty table — rows no
# order of the two gives). They also call no function the client's search_path could
# resolve to one of its own. (backslash_quote, which the proxy does not change, is read with
# the snapshot's export.)
GUARD_SETTINGS = ("SHOW exit_on_error", "SET LOCAL exit_on_error = off")
EXIT_ON_ERROR = ("the session's exit_on_error is on: any error of the proxy's own statements "
                 "would end the session")
BACKSLASH_QUOTE = ("the session's backslash_quote is off and the query holds \\' (an error in "
                   "PostgreSQL that the instrumented text, spelled anew, would not raise)")
NOT_UTF8 = ("the session's client_encoding is not UTF8: the proxy reads the client's SQL and "
            "parameters as UTF-8")
SERIALIZABLE = ("the session's transactions are SERIALIZABLE: the proxy's REPEATABLE READ "
                "wrapping, and a query that reads only some fragments, would hide its reads "
                "from PostgreSQL's serializable conflict checks")
# A client's statement of the same name would be Closed by the proxy: the names of its own
# statements end in a random suffix per process.
_SUFFIX = secrets.token_hex(8)
CANCEL_STATEMENT = f"_imp_cancel_{_SUFFIX}"      # PostgreSQL's own cancel, during a wrapping
PROBE_STATEMENT = f"_imp_probe_{_SUFFIX}"        # the client's SQL: its parameter types
INFERRED_STATEMENT = f"_imp_inferred_{_SUFFIX}"  # the same without declared types
WRAP_STATEMENT = f"_imp_wrapped_{_SUFFIX}"       # the instrumented SQL the Bind is moved to
CHECK_STATEMENT = f"_imp_check_{_SUFFIX}"        # privilege checks run as the client
OWN_STATEMENT = f"_imp_own_{_SUFFIX}"            # BEGIN, SELECT, COMMIT, ROLLBACK
VERIFY_STATEMENT = f"_imp_verify_{_SUFFIX}"      # is the client's statement the recorded one?
# The client's named statement (text parameter) holds the probe's SQL and parameter types.
_VERIFY = ("SELECT EXISTS (SELECT FROM pg_catalog.pg_prepared_statements c,"
           " pg_catalog.pg_prepared_statements p WHERE c.name = $1 AND p.name = '"
           + PROBE_STATEMENT + "' AND c.statement = p.statement"
           " AND c.parameter_types::oid[] = p.parameter_types::oid[])")
STALE = "the client's statement is not (or no longer) the one the proxy recorded"


class Fallback(Exception):
    """The wrapping cannot go on; the client's original messages are sent instead."""


WRONG_OBJECT_TYPE = "42809"   # LOCK TABLE of a materialized view or a foreign table


@dataclass(frozen=True, slots=True)
class BatchShape:
    """A ``[Parse] Bind [Describe] Execute Sync`` batch found in the client's bytes."""

    parse: Parse | None
    bind: Bind
    execute: Execute
    sql: str
    param_types: tuple[int, ...]
    parse_raw: bytes
    describe_raw: bytes
    execute_raw: bytes
    sync_raw: bytes
    end: int                # offset after the Sync in the buffer it was found in


_SHAPES = (b"PBDES", b"PBES", b"BDES", b"BES")   # the message types of a batch wrapped


def batch_shape(data: bytes, pos: int, max_size: int,
                statements: Mapping[str, tuple[str, tuple[int, ...], int]]
                ) -> BatchShape | None:
    """The batch starting at ``pos`` if it is complete in ``data`` and has the one shape the
    proxy wraps (one Execute without a row limit, on the portal just bound); else None.
    Without a Parse, only a named statement's batch, with the SQL and types ``statements``
    recorded for it (:func:`begin_and_prepare` checks that the statement still holds them)."""
    frames: list[tuple[int, int, int]] = []
    p = pos
    while len(frames) < 5:
        e = frame_end(data, p, max_size)
        if e < 0:
            return None
        frames.append((data[p], p, e))
        p = e
        if data[frames[-1][1]] == SYNC:
            break
    kinds = bytes(f[0] for f in frames)
    if kinds not in _SHAPES:
        return None
    raw = {k: bytes(data[s:e]) for k, s, e in frames}
    try:
        parse = codec.decode_parse(raw[PARSE]) if PARSE in raw else None
        bind = codec.decode_bind(raw[BIND])
        execute = codec.decode_execute(raw[EXECUTE])
        describe = codec.decode_describe(raw[DESCRIBE]) if DESCRIBE in raw else None
    except ProtocolViolation:
        return None  # not wrapped: PostgreSQL answers the malformed message itself
    if execute.max_rows != 0 or execute.portal != bind.portal:
        return None
    if parse is not None:
        if parse.name != bind.statement:
            return None
        sql, types = parse.sql, parse.param_types
    elif bind.statement and bind.statement in statements:  # the unnamed one cannot be checked
        sql, types, _seen = statements[bind.statement]
    else:
        return None
    if describe is not None and (describe.kind, describe.name) not in (("P", bind.portal),
                                                                       ("S", bind.statement)):
        return None
    return BatchShape(parse, bind, execute, sql, types, raw.get(PARSE, b""),
                      raw.get(DESCRIBE, b""), raw[EXECUTE], raw[SYNC], p)


def batch_wanted(data: bytes, pos: int, max_size: int) -> tuple[int, bool]:
    """``(length, inside)``: how long ``data`` must grow before :func:`batch_shape` can judge
    the batch starting at ``pos`` (0: it can judge it now), and whether ``data`` ends inside
    a message. Nonzero while the messages there may still become a wrapped shape.

    Why: a batch that arrived in two reads or more was never wrapped, so the same query was
    sped up or not by chance (found in session 29: libpq 16 and later send each message of
    8 kB or more on its own, so psycopg's Parse of a long query often arrived alone; a
    network splits any batch into segments). Inside a message its sender is still sending,
    so waiting cannot stall it; between two messages a client may wait for a reply (an
    error PostgreSQL sends at once): the caller waits there only briefly."""
    kinds = bytearray()
    p, n = pos, len(data)
    while p < n:
        kinds.append(data[p])
        if not any(shape.startswith(kinds) for shape in _SHAPES):
            return 0, False
        e = frame_end(data, p, max_size)
        if e < 0:
            declared = declared_end(data, p, max_size)
            return (p + 5 if declared < 0 else declared), True
        p = e
    return (n + 1, False) if kinds[-1:] != b"S" else (0, False)


# ------------------------------------------------------------------ parameters

_TEXT_INT = INTEGERS   # not oid: PostgreSQL reads "-1" as 4294967295
_BINARY = {INT2: INT16_BYTES, INT4: INT32_BYTES, INT8: INT64_BYTES, FLOAT8: FLOAT8_BYTES}


_TYPED = frozenset({BOOL, *INTEGERS, FLOAT8, NUMERIC})
"""Types decoded to Python values (bool, the integers, float8, numeric) that the library's
own statements bind with psycopg's type for them or inline with their type: they mean there
what they mean in the client's query."""


def same_meaning(declared: int, inferred: int) -> bool:
    """Does the client's parameter of type ``declared`` mean in its query what the decoded
    value means in the library's own statements (the capture, the delta reads, a restarted
    manager's), where PostgreSQL infers ``inferred`` for it? A value of :data:`_TYPED` keeps
    its type there; any other is left to be read as the type PostgreSQL infers. Found, where
    that is another type: a ``text`` parameter compared with a ``char(3)`` column as text
    (``'ab' <> 'ab '``) but captured as ``bpchar`` (blanks ignored); a ``timestamptz`` read
    as a ``timestamp`` (its offset dropped), a ``timestamp`` as a ``date`` (a group missing
    in each)."""
    return (declared in _TYPED or declared == inferred
            or (declared in TEXT_LIKE and inferred in TEXT_LIKE))


def decode_params(bind: Bind, types: Sequence[int],
                  inferred: Sequence[int] | None = None) -> list[object] | None:
    """Bind parameters as Python values for the library; None when one cannot be decoded
    (a type that does not have :func:`same_meaning` as the one PostgreSQL would infer for
    it, ``inferred``, when that is given; binary format of a type other than
    int2/int4/int8/float8/bool and those :func:`text_of_binary` writes as text (date,
    time, timestamp, timestamptz, uuid); float4 in any format:
    PostgreSQL reads text as the nearest float4 and the nearest double is another value,
    and a float4 is no float8 where it is cast to text or meets another float4 in
    arithmetic. Found: binary float4 0.1, decoded as its float8 widening, was inlined into
    the delta reads as ``'0.10000000149011612'::float8``; ``s <> $1::text`` then counted
    rows of ``'0.1'`` that the query does not, and a maintained sketch lost their group.)"""
    out: list[object] = []
    for i, raw in enumerate(bind.params):
        oid = types[i] if i < len(types) else 0
        if inferred is not None and not same_meaning(oid, inferred[i] if i < len(inferred)
                                                     else 0):
            return None
        if raw is None:
            out.append(None)
            continue
        if bind.param_format(i) == BINARY_FORMAT:
            if oid == BOOL and len(raw) == 1:
                out.append(raw != b"\x00")
            elif oid in _BINARY and len(raw) == _BINARY[oid].size:
                out.append(_BINARY[oid].unpack(raw)[0])
            elif (text := text_of_binary(oid, raw)) is not None:
                out.append(text)   # as the same value sent in text format
            else:
                return None
            continue
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            return None
        try:
            if oid in _TEXT_INT:
                out.append(int(text))
            elif oid == FLOAT4:
                return None
            elif oid == FLOAT8:
                out.append(float(text))
            elif oid == NUMERIC:
                out.append(Decimal(text))
            elif oid == BOOL:
                out.append(pg_bool(text))
            else:
                out.append(text)
        except (ValueError, InvalidOperation):
            return None
    return out


def pg_bool(text: str) -> bool:
    """PostgreSQL's boolean input (``parse_bool``): any prefix of ``true``/``yes`` or of
    ``false``/``no``, ``on``/``off`` (two letters at least), ``1``/``0``, case and surrounding
    white space ignored; raises ValueError for anything else, as PostgreSQL fails. (A set of
    six spellings read ``'tr'`` as false, where PostgreSQL reads true.)"""
    s = text.strip(" \t\n\r\v\f").lower()
    if s and ("true".startswith(s) or "yes".startswith(s) or s in ("on", "1")):
        return True
    if s and ("false".startswith(s) or "no".startswith(s) or s in ("of", "off", "0")):
        return False
    raise ValueError(f"invalid input syntax for type boolean: {text!r}")


def _parameter_types(msg: bytes) -> tuple[int, ...]:
    """A ParameterDescription's types; its count is unsigned, as PostgreSQL sends it (found:
    32,768 or more parameters read as a negative count ended the session)."""
    return unpack_array_from("I", msg, 7, unpack_uint16_from(msg, 5)[0])


# ------------------------------------------------------------------ snapshot + prepare

def _once(name: str, sql: str, params: tuple[bytes | None, ...] = (),
          types: tuple[int, ...] = ()) -> bytes:
    """``sql`` Parsed as the proxy's statement ``name``, Bound with ``params`` (text) to the
    unnamed portal, Executed and Closed. No Sync."""
    return (codec.encode_parse(name, sql, types)
            + codec.encode_bind(Bind("", name, (), params, ()))
            + codec.encode_execute("") + codec.encode_close("S", name))


def _own(*sqls: str) -> bytes:
    """The proxy's fixed statements ``sqls`` in the extended protocol (:func:`_once`); first a
    Close of their name (one left by a failure after its Parse). No Sync.

    Why not a simple Query: PostgreSQL's exec_simple_query drops the client's unnamed
    prepared statement, which the client may Bind again after the wrapping."""
    return codec.encode_close("S", OWN_STATEMENT) + b"".join(
        _once(OWN_STATEMENT, sql) for sql in sqls)


_DROP_UNNAMED = codec.encode_close("S", "")
# the statements an error may have left behind (PostgreSQL skips to the Sync)
_LEFTOVERS = b"".join(codec.encode_close("S", n)
                      for n in (PROBE_STATEMENT, INFERRED_STATEMENT, VERIFY_STATEMENT))
# a rollback closes them too: a failed probe (a stale client statement) left its statement in
# the client's session, seen in pg_prepared_statements (found by a regression search)
_ROLLBACK = _LEFTOVERS + _own("ROLLBACK") + codec.encode_sync()


def _probe(sql: str, types: tuple[int, ...], verify: str | None) -> bytes:
    """Parse and Describe of the client's SQL with the types it declared (the statement's
    parameter types) and, when it declared any, without them: the types PostgreSQL infers,
    which the library's own statements get (:func:`decode_params`). ``verify``: the name of
    the client's statement that the batch Binds without a Parse; one DataRow answers
    whether it holds that SQL with the probe's parameter types (``t``/``f``), and a Describe
    of it fails where its plan may no longer return its result type. No Sync."""
    out = (codec.encode_parse(PROBE_STATEMENT, sql, types)
           + codec.encode_describe("S", PROBE_STATEMENT))
    if verify is not None:
        # the Describe revalidates the client's statement: one whose result type changed
        # since it was prepared (ALTER COLUMN TYPE, another search_path) raises 0A000 there,
        # as its Bind would, and pgjdbc prepares it again; the proxy's statement, parsed
        # afresh, answered with the new type, which pgjdbc decoded as the old one (found: a
        # numeric sum read as an int8, 562954248388608 for 1601800)
        out += (_once(VERIFY_STATEMENT, _VERIFY, (verify.encode(),), (TEXT,))
                + codec.encode_describe("S", verify))
    out += codec.encode_close("S", PROBE_STATEMENT)
    if any(types):
        out += (codec.encode_parse(INFERRED_STATEMENT, sql)
                + codec.encode_describe("S", INFERRED_STATEMENT)
                + codec.encode_close("S", INFERRED_STATEMENT))
    return out


def _first_error(replies: list[tuple[int, bytes]]) -> str | None:
    for typ, msg in replies:
        if typ == ERROR_RESPONSE:
            return codec.decode_error_fields(msg).message
    return None


async def _rollback(s: Session) -> None:
    await s.exchange_with_upstream(_ROLLBACK, 1)


async def begin_and_prepare(s: Session, sql: str, lock: str | None, bind: Bind | None,
                            types: tuple[int, ...], explain: bool = False,
                            verify: str | None = None,
                            drop_unnamed: bool = False
                            ) -> tuple[PrepareOutcome, tuple[int, ...]]:
    """Steps 1–2 of the wrapping, the snapshot in one round trip. On return the client's
    backend is inside the proxy's REPEATABLE READ transaction; on Fallback it has been rolled
    back. ``lock``: the decision's ``LOCK TABLE`` of the query's tables, sent before the
    snapshot's export (None: none). ``explain``: the outcome also carries the heavy
    backend's choice (IMP EXPLAIN).
    ``verify`` (with ``bind``): the client's named statement that is to hold ``sql`` with
    ``types`` as declared; Fallback if it does not (a failed, skipped or deallocated Parse
    left the proxy's record stale), so PostgreSQL answers the client's messages itself.
    ``drop_unnamed``: first Close the client's unnamed statement, as PostgreSQL does for the
    client's simple Query being wrapped, whichever way the wrapping ends."""
    refused = await s.router.refused(s.dbname)
    if refused is not None:
        raise Fallback(refused)
    begin = (BEGIN_SNAPSHOT[0], *GUARD_SETTINGS, *(() if lock is None else (lock,)),
             BEGIN_SNAPSHOT[1])
    payload = (_DROP_UNNAMED if drop_unnamed else b"") + _LEFTOVERS + _own(*begin)
    if bind is not None:
        payload += _probe(sql, types, verify)
    replies = await s.exchange_with_upstream(payload + codec.encode_sync(), 1)
    err = _first_error(replies)
    rows = [codec.decode_data_row(m) for t, m in replies if t == DATA_ROW]
    shown = rows.pop(0).values[0] if rows else None
    if shown == b"on":
        await _rollback(s)
        raise Fallback(EXIT_ON_ERROR)
    if err is not None or not rows or rows[0].values[0] is None:
        await _rollback(s)
        if any(t == ERROR_RESPONSE and codec.decode_error_fields(m).fields.get("C")
               == WRONG_OBJECT_TYPE for t, m in replies):
            s.router.refuse(sql, f"LOCK TABLE refused its relations: {err}")
        raise Fallback(f"the wrapping's BEGIN, LOCK or snapshot export failed: {err}")
    if rows[0].values[10 + len(SESSION_SETTINGS)] == b"t" and "\\'" in sql:
        await _rollback(s)
        raise Fallback(BACKSLASH_QUOTE)
    snapshot = rows[0].values[0].decode()
    search_path = rows[0].values[1].decode() if rows[0].values[1] is not None else None
    text = rows[0].values[2]
    snapshot_text = text.decode() if text is not None else None
    settings = tuple((v or b"").decode() for v in rows[0].values[3:3 + len(SESSION_SETTINGS)])
    if rows[0].values[3 + len(SESSION_SETTINGS)] == b"t":
        await _rollback(s)
        raise Fallback(SERIALIZABLE)
    started = (rows[0].values[4 + len(SESSION_SETTINGS)] or b"").decode()
    if rows[0].values[5 + len(SESSION_SETTINGS)] != b"UTF8":
        await _rollback(s)
        raise Fallback(NOT_UTF8)
    if verify is not None and (len(rows) < 2 or rows[1].values[0] != b"t"):
        await _rollback(s)
        raise Fallback(STALE)
    params: list[object] | None = None
    if bind is not None:
        described = [_parameter_types(m) for t, m in replies if t == PARAMETER_DESCRIPTION]
        if verify is not None:
            del described[1:2]   # the client's statement's, described after the probe's
        types = described[0] if described else types
        params = decode_params(bind, types, described[-1] if described else types)
        if params is None:
            await _rollback(s)
            raise Fallback("a parameter cannot be decoded")
    timeout = float(rows[0].values[6 + len(SESSION_SETTINGS)] or 0)
    lock_timeout = (rows[0].values[7 + len(SESSION_SETTINGS)] or b"0").decode()
    # the client's role (SET ROLE included): a hook that checks_role does no capture for a
    # query it may not run (the instrumented query, run as the client, is checked anyway)
    role = (rows[0].values[9 + len(SESSION_SETTINGS)] or b"").decode() or None
    try:
        with _service_bounded(s, timeout):
            outcome = await s.router.prepare(s.dbname, snapshot, search_path, sql, params,
                                             started=started, explain=explain,
                                             snapshot_text=snapshot_text, settings=settings,
                                             cancel=s.new_service_cancel,
                                             lock_timeout=lock_timeout, role=role, lock=lock)
    except Exception as exc:  # the library or the service connection failed: pass through
        log.warning("sketch prepare failed, sending the original query: %s", exc)
        await _rollback(s)
        raise Fallback(f"prepare failed: {exc}") from exc
    return outcome, types


@contextlib.contextmanager
def _service_bounded(s: Session, seconds: float) -> Iterator[None]:
    """Cancels the wrapping's service work once the client's ``statement_timeout`` (``seconds``,
    0: none) has passed: the prepare fails and the client's own query runs, under its own
    timeout. Why: the client's backend waits idle in the proxy's transaction, where the
    timeout does not count (found: rows after 3.7 s where PostgreSQL fails at 0.3 s, and no
    end at all while another session held the table's lock)."""
    if seconds <= 0:
        yield
        return

    timer = s.loop.call_later(seconds, s.cancel_service)
    try:
        yield
    finally:
        timer.cancel()


def _forward_original(s: Session, raw: bytes) -> None:
    """Sends the client's messages as they were (one Query, or one batch ending in Sync)."""
    s.router.count("passthrough")
    s.pending += 1
    s.batch_open = False
    assert s.upstream is not None
    s.upstream.write(raw)


async def _run_and_commit(s: Session, statement: bytes, ready: int, close: bytes = b"",
                          skip: int = 0, hold: bool = False) -> bool:
    """Step 3: ``statement`` (messages up to its ``ready`` ReadyForQuery), its replies
    forwarded, and COMMIT (then ``close``: Close messages of the proxy's own, then Sync) in
    the same write, swallowed; the client then gets the upstream's own ReadyForQuery of that
    COMMIT. COMMIT goes through the extended protocol (:func:`_own`).

    ``skip``: ``statement`` starts with that many Close/Parse messages of the proxy's own,
    whose replies are swallowed. If one of them fails, PostgreSQL skips the rest up to the
    Sync, nothing reaches the client and False is returned: the transaction is rolled back
    (COMMIT answers ROLLBACK) and the client's messages are still to be sent.

    ``hold``: an error with a position before the statement's first row description (an
    error in the SQL text, whose position counts in the instrumented text, not the client's)
    is not forwarded either: False is returned, and the client's query is still to be sent.

    Why in one write: it saves round trips, and COMMIT needs no decision: after an error
    PostgreSQL answers it with ROLLBACK."""
    end = _own("COMMIT") + close + codec.encode_sync()
    final = await s.exchange_with_upstream(statement + end, ready + 1, forward=ready,
                                           skip=skip, hold=hold)
    # before the statement's ReadyForQuery only the proxy's own replies were kept
    first_ready = next(i for i, (typ, _m) in enumerate(final) if typ == READY_FOR_QUERY)
    failed = _first_error(final[:first_ready])
    if failed is not None:
        log.debug("a statement of the proxy's failed: %s", failed)
        return False
    err = _first_error(final[first_ready:])
    if err is not None:
        log.warning("COMMIT after a wrapped query failed: %s", err)
    s.client.write(final[-1][1])
    return True


def _fell_back(s: Session, raw: bytes, exc: Fallback) -> None:
    log.debug("fallback: %s", exc)
    s.router.count("fallbacks")
    _forward_original(s, raw)


def _start_wrapping(s: Session) -> None:
    s.enter_parse_mode()
    s.wrapping, s.cancelled, s.service_cancel = True, False, None


def _end_wrapping(s: Session) -> None:
    s.wrapping = False
    s.leave_parse_mode()


_SELF_CANCEL = (codec.encode_close("S", CANCEL_STATEMENT)
                + codec.encode_parse(CANCEL_STATEMENT, "SELECT pg_catalog.pg_cancel_backend("
                                     "pg_catalog.pg_backend_pid())")
                + codec.encode_bind(Bind(CANCEL_STATEMENT, CANCEL_STATEMENT, (), (), ()))
                + codec.encode_execute(CANCEL_STATEMENT))
_OURS = (CLOSE_COMPLETE, PARSE_COMPLETE, BIND_COMPLETE)
_DROP_CANCEL = codec.encode_close("S", CANCEL_STATEMENT) + codec.encode_sync()


async def _cancelled(s: Session, client_part: bytes, execute: bytes, sync: bytes) -> bool:
    """Answers a CancelRequest that arrived while the query was being wrapped (outside the
    proxy's transaction now), as PostgreSQL would have: the backend cancels itself, so the
    client gets PostgreSQL's own ``57014 canceling statement due to user request`` in place
    of its query's result. ``client_part``, ``execute``, ``sync``: an extended batch's Parse,
    Bind and Describe (PostgreSQL runs them first, as before a cancelled Execute), its
    Execute (skipped after the error) and Sync; all empty for a simple Query. The replies of
    the proxy's own messages are swallowed. False, with nothing sent, when a simple Query's
    cancel statement did not fail (the caller sends the query instead).

    Why: the backend waits idle in the proxy's transaction while a service connection
    prepares, and PostgreSQL ignores a cancel there; the query then ran to its end (found:
    2.6 s and all its rows where PostgreSQL cancels at 0.3 s)."""
    replies = await s.exchange_with_upstream(
        client_part + _SELF_CANCEL + execute + (sync or codec.encode_sync()) + _DROP_CANCEL, 2)
    end = next(i for i, (t, _m) in enumerate(replies) if t == READY_FOR_QUERY) + 1
    replies = replies[:end]   # the rest answers _DROP_CANCEL
    if not client_part and not any(t == ERROR_RESPONSE for t, _m in replies):
        return False
    first = next((i for i, (t, _m) in enumerate(replies) if t == CLOSE_COMPLETE), None)
    if first is not None and tuple(t for t, _m in replies[first:first + 3]) == _OURS:
        del replies[first:first + 3]
    s.router.count("cancelled")
    s.client.write(b"".join(m for _t, m in replies))
    return True


_PARAMETER = re.compile(r"\$(\d+)")


def _highest_parameter(sql: str) -> int:
    """The highest ``$n`` in ``sql`` (0: none); one inside a literal or comment counts too,
    which errs towards a fallback. With every type of ``$1``…``$k`` given, a statement whose
    highest is at most k takes exactly those k parameters (a higher one would be inferred)."""
    return max((int(n) for n in _PARAMETER.findall(sql)), default=0)


def _count_outcome(s: Session, outcome: PrepareOutcome) -> None:
    s.router.count("wrapped")
    if outcome.decision == "use":
        s.router.count("used")
    elif outcome.decision == "capture":
        s.router.count("captured")


async def _wrappable(s: Session, sql: str, bound: bool = False) -> Decision | None:
    """The library's decision when it calls ``sql`` a candidate and the backend is idle with
    nothing in flight (DESIGN §5: the proxy injects only on an idle backend, outside client
    transactions), else None. ``bound``: the statement has parameters (a first sight is
    then not declined before its analysis: the decline needs their values)."""
    idle = s.scanner.status == ord("I") and s.idle
    decision = await s.router.classify(sql, None if bound or not idle else s.dbname)
    wrappable = decision.candidate and s.scanner.status == ord("I") and s.idle
    return decision if wrappable else None


async def wrap_query(s: Session, sql: str, raw: bytes) -> None:
    """A sketchable simple Query (docs/INTERFACES.md §2)."""
    decision = await _wrappable(s, sql)
    if decision is None:
        _forward_original(s, raw)
        return
    _start_wrapping(s)
    try:
        try:
            outcome, _ = await begin_and_prepare(s, sql, decision.lock, None, (),
                                                 drop_unnamed=True)
        except Fallback as exc:
            if not s.cancelled or not await _cancelled(s, b"", b"", b""):
                _fell_back(s, raw, exc)
            return
        if outcome.instrumented_sql is None or s.cancelled:
            await _rollback(s)
            if not s.cancelled or not await _cancelled(s, b"", b"", b""):
                _forward_original(s, raw)
            return
        _count_outcome(s, outcome)
        if not await _run_and_commit(s, codec.encode_query(outcome.instrumented_sql), 1,
                                     hold=True):
            # found: 42501 on a schema pointed into the re-printed text, not the client's
            _fell_back(s, raw, Fallback("the instrumented SQL failed at a position"))
    finally:
        _end_wrapping(s)


async def wrap_batch(s: Session, raw: bytes, shape: BatchShape) -> None:
    """A sketchable extended-protocol batch: the client's Bind is moved to a proxy-owned
    statement holding the instrumented SQL (same parameter types); its replies the client
    did not cause (the proxy's Parse/Close/COMMIT) are swallowed."""
    decision = await _wrappable(s, shape.sql, bool(shape.bind.params))
    if decision is None:
        _forward_original(s, raw)
        return
    _start_wrapping(s)
    try:
        try:
            outcome, types = await begin_and_prepare(
                s, shape.sql, decision.lock, shape.bind, shape.param_types,
                verify=shape.bind.statement if shape.parse is None else None)
            if outcome.instrumented_sql is None or s.cancelled:
                await _rollback(s)
                raise Fallback("library chose passthrough")
            if len(types) != len(shape.bind.params) \
                    or _highest_parameter(outcome.instrumented_sql) > len(types):
                await _rollback(s)
                raise Fallback("instrumented SQL takes other parameters than the client binds")
        except Fallback as exc:
            client_part = shape.parse_raw + codec.encode_bind(shape.bind) + shape.describe_raw
            if not s.cancelled or not await _cancelled(s, client_part, shape.execute_raw,
                                                       shape.sync_raw):
                _fell_back(s, raw, exc)
            return
        ours = (codec.encode_close("S", WRAP_STATEMENT)
                + codec.encode_parse(WRAP_STATEMENT, outcome.instrumented_sql, types))
        bind = codec.encode_bind(replace(shape.bind, statement=WRAP_STATEMENT))
        if not await _run_and_commit(
                s, ours + shape.parse_raw + bind + shape.describe_raw + shape.execute_raw
                + shape.sync_raw, 1, codec.encode_close("S", WRAP_STATEMENT), skip=2):
            _fell_back(s, raw, Fallback("instrumented SQL does not parse"))
            return
        _count_outcome(s, outcome)
    finally:
        _end_wrapping(s)


# ------------------------------------------------------------------ IMP statements

async def client_may_not_run(s: Session, sql: str) -> str | None:
    """PostgreSQL's error when the client's role may not run ``sql``, else None: a plain
    ``EXPLAIN`` on the client's own backend (permission checks and planning, no execution;
    the extended protocol refuses a second statement)."""
    return _first_error(await s.exchange_with_upstream(_as_client("EXPLAIN " + sql),
                                                       AS_CLIENT_READIES))


# each name as the library reports it: "schema.table", or a bare name (search_path). Every
# name and operator qualified: the check runs on the client's search_path, where a schema of
# the role's own before pg_catalog could answer it (found by a helper's search: a role's
# has_table_privilege() that returns true showed it every sketch)
_READABLE = ("SELECT t FROM pg_catalog.jsonb_array_elements_text($1::pg_catalog.text"
             "::pg_catalog.jsonb) AS t WHERE coalesce("
             "(SELECT pg_catalog.has_table_privilege(c.oid, 'SELECT')"
             " FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n"
             " ON n.oid OPERATOR(pg_catalog.=) c.relnamespace"
             " WHERE pg_catalog.concat(n.nspname, '.', c.relname) OPERATOR(pg_catalog.=) t"
             " LIMIT 1), pg_catalog.has_table_privilege(pg_catalog.to_regclass("
             "pg_catalog.quote_ident(t)), 'SELECT'), false)")


ABORTED = "current transaction is aborted, commands ignored until end of transaction block"


async def readable_sketches(s: Session, sketches: list[dict[str, object]]
                            ) -> list[dict[str, object]]:
    """The sketches whose every table the client's role may read (fragment counts and
    versions reveal data): asked on the client's own backend, as the client."""
    tables = sorted({str(t) for sk in sketches for t in _as_list(sk.get("tables"))})
    if not tables:
        return sketches
    if s.scanner.status == ord("E"):   # it cannot ask: PostgreSQL's refusal, not an empty list
        raise admin.AdminError("25P02", ABORTED)
    replies = await _ask_as_client(s, _READABLE, (json.dumps(tables).encode(),))
    if _first_error(replies) is not None:
        return []
    readable = {v.decode() for t, m in replies if t == DATA_ROW
                for v in codec.decode_data_row(m).values if v is not None}
    return [sk for sk in sketches if all(str(t) in readable for t in _as_list(sk.get("tables")))]


AS_CLIENT_READIES = 2
"""The ReadyForQuery messages that answer :func:`_as_client`."""


def _as_client(sql: str, params: tuple[bytes, ...] = (), in_transaction: bool = False) -> bytes:
    """``sql`` as the proxy's check statement (closed first), then a Sync, then a Close of it
    and a Sync: run on the client's own backend, as the client; two ReadyForQuery. Why the
    second Close: when ``sql`` fails, PostgreSQL skips the first one (to the Sync), and the
    statement stayed in the client's session (found by a regression search: after an
    ``IMP EXPLAIN`` of a table the role may not read). ``in_transaction``: inside the
    client's transaction block, the check runs in a savepoint, rolled back to after it: a
    failing check left the client's transaction aborted behind an IMP statement that answered
    (found by a helper's search). Before the check, exit_on_error goes off until the Sync (or
    the rollback to the savepoint): a failing check ended such a session (found by a
    regression search: an ``IMP EXPLAIN`` of a misspelt column)."""
    before, after = (_own(_CHECK_SAVEPOINT, _EXIT_ON_ERROR_OFF), _own(*_CHECK_UNDO)) \
        if in_transaction else (_own(_EXIT_ON_ERROR_OFF), b"")
    return (before + codec.encode_close("S", CHECK_STATEMENT)
            + _once(CHECK_STATEMENT, sql, params) + codec.encode_sync()
            + after + codec.encode_close("S", CHECK_STATEMENT) + codec.encode_sync())


_CHECK_SAVEPOINT = "SAVEPOINT _imp_check"
_EXIT_ON_ERROR_OFF = ("SELECT 1 WHERE pg_catalog.set_config('exit_on_error', 'off', true)"
                      " IS NULL")   # no row: the callers read the check's rows only
_CHECK_UNDO = ("ROLLBACK TO SAVEPOINT _imp_check", "RELEASE SAVEPOINT _imp_check")


async def _ask_as_client(s: Session, sql: str, params: tuple[bytes, ...] = ()
                         ) -> list[tuple[int, bytes]]:
    """The replies of ``sql`` run on the client's own backend, as the client
    (:func:`_as_client`), up to its last ReadyForQuery."""
    s.enter_parse_mode()
    try:
        return await s.exchange_with_upstream(
            _as_client(sql, params, s.scanner.status == ord("T")), AS_CLIENT_READIES)
    finally:
        s.leave_parse_mode()


_STATEMENT_EXISTS = ("SELECT FROM pg_catalog.pg_prepared_statements AS p"
                     " WHERE p.name OPERATOR(pg_catalog.=) $1")


async def statement_exists(s: Session, name: str) -> bool:
    """Has the client's session a prepared statement called ``name``?"""
    replies = await _ask_as_client(s, _STATEMENT_EXISTS, (name.encode(),))
    return _first_error(replies) is None and any(t == DATA_ROW for t, _m in replies)


def _as_list(value: object) -> list[object]:
    return list(value) if isinstance(value, list | tuple) else []


async def explain(s: Session, sql: str) -> list[tuple[str, object]]:
    """What the proxy would do with ``sql`` now: classify, then (if a candidate and the
    backend is idle) the real snapshot + prepare steps, rolled back afterwards."""
    decision = await s.router.classify(sql)
    rows: list[tuple[str, object]] = [("candidate", decision.candidate),
                                      ("template", decision.template)]
    if not s.hook_on:
        return [("decision", "passthrough"), ("reason", "sketches disabled for this session"),
                ("sketch_id", None), ("instrumented_sql", None), *rows]
    if not decision.candidate:
        return [("decision", "passthrough"), ("reason", decision.reason), ("sketch_id", None),
                ("instrumented_sql", None), *rows]
    if s.scanner.status != ord("I") or not s.idle:
        return [("decision", "passthrough"), ("reason", "inside a client transaction"),
                ("sketch_id", None), ("instrumented_sql", None), *rows]
    s.enter_parse_mode()
    try:
        # the service connection captures as the service role: first make sure the client's
        # own role may run the query, else IMP EXPLAIN would reveal data (fragments, ranges) of
        # tables the client cannot read
        denied = await client_may_not_run(s, sql)
        if denied is not None:
            return [("decision", "passthrough"), ("reason", denied), ("sketch_id", None),
                    ("instrumented_sql", None), *rows]
        try:
            outcome, _ = await begin_and_prepare(s, sql, decision.lock, None, (), explain=True)
        except Fallback as exc:
            return [("decision", "passthrough"), ("reason", str(exc)), ("sketch_id", None),
                    ("instrumented_sql", None), *rows]
        await _rollback(s)
    finally:
        s.leave_parse_mode()
    return [("decision", outcome.decision), ("reason", outcome.reason),
            ("sketch_id", outcome.sketch_id), ("instrumented_sql", outcome.instrumented_sql),
            *rows, *outcome.details]


_SUPERUSER = ("SELECT r.rolsuper FROM pg_catalog.pg_roles AS r"
              " WHERE r.rolname OPERATOR(pg_catalog.=) pg_catalog.current_user()")
"""Qualified operator: the check runs on the client's search_path, where a role's own ``=``
on ``name`` matched every role and the first, a superuser, answered (found by a helper's
search: a role with CREATE on a schema ran ``IMP DROP ALL SKETCHES``)."""


async def _require_superuser(s: Session, what: str) -> None:
    """Raises PostgreSQL's ``42501 permission denied to …`` unless the client's role (its
    ``current_user``, SET ROLE included) is a superuser: asked on the client's own backend.

    Why: dropping sketches and the library's settings are shared by every session of the
    proxy (every role's), and ``IMP DROP SKETCH <id>`` also told which ids exist; directly, a
    role without privileges cannot even read or delete ``imp.sketches``."""
    if s.scanner.status == ord("E"):
        raise admin.AdminError("25P02", ABORTED)
    replies = await _ask_as_client(s, _SUPERUSER)
    rows = [codec.decode_data_row(m).values for t, m in replies if t == DATA_ROW]
    if _first_error(replies) is None and rows and rows[0] and rows[0][0] == b"t":
        return
    raise admin.AdminError("42501", f"permission denied to {what}: must be superuser")


_SHARED = {"drop": "drop a sketch", "drop_all": "drop all sketches",
           "set": "change a process-wide IMP setting",
           "set_strategy": "change a sketch's strategy"}
"""The IMP statements that change what every session of the proxy shares (superusers
only); ``IMP SET enabled`` is the session's own and open to every role."""


async def run_admin(s: Session, cmd: admin.AdminCommand) -> admin.AdminResult:
    router = s.router
    router.count("admin_commands")
    if cmd.kind in _SHARED and not (cmd.kind == "set" and cmd.argument in admin.SETTINGS):
        what = _SHARED[cmd.kind]
        await _require_superuser(s, f"{what} ({cmd.argument})" if cmd.kind == "set" else what)
    try:
        if cmd.kind == "show_sketches":
            rows = admin.sketch_rows(await readable_sketches(s, await router.sketches(s.dbname)))
            return admin.AdminResult(cmd.columns, rows, f"SELECT {len(rows)}")
        if cmd.kind == "show_stats":
            items: list[tuple[str, object]] = [("session.enabled", s.enabled),
                                               ("session.statement_records",
                                                len(s.statements)),
                                               ("library", router.hook is not None)]
            items += [(f"proxy.{k}", v) for k, v in sorted(router.counters.items())]
            items += sorted((await router.stats(s.dbname)).items())
            rows = admin.key_value_rows(items)
            return admin.AdminResult(cmd.columns, rows, f"SELECT {len(rows)}")
        if cmd.kind == "explain":
            assert cmd.argument is not None
            rows = admin.key_value_rows(await explain(s, cmd.argument))
            return admin.AdminResult(cmd.columns, rows, f"SELECT {len(rows)}")
        if cmd.kind == "drop":
            assert cmd.argument is not None
            if not await router.drop(s.dbname, int(cmd.argument)):
                raise admin.AdminError("42704", f"sketch {cmd.argument} does not exist")
            router.invalidate()
            return admin.AdminResult(None, (), "IMP DROP SKETCH")
        if cmd.kind == "drop_all":
            n = await router.drop_all(s.dbname)
            router.invalidate()
            return admin.AdminResult(None, (), f"IMP DROP {n}")
        if cmd.kind == "set":
            assert cmd.argument is not None and cmd.value is not None
            if cmd.argument == "enabled":   # DEFAULT: the proxy's own setting, as SET does
                s.set_enabled(s.server.config.sketches if cmd.value == "default"
                              else admin.parse_bool_setting(cmd.value))
            else:
                await router.configure(cmd.argument, cmd.value)
            return admin.AdminResult(None, (), "IMP SET")
        if cmd.kind == "set_strategy":
            assert cmd.argument is not None and cmd.value is not None
            await router.set_strategy(s.dbname, int(cmd.argument), cmd.value)
            return admin.AdminResult(None, (), "IMP SET")
    except ServiceError as exc:
        raise admin.AdminError("08006", str(exc)) from exc
    except UpstreamError:
        raise
    except admin.AdminError:
        raise
    except Exception as exc:  # a library failure is reported to the client, not fatal
        log.warning("IMP %s failed: %s", cmd.kind, exc)
        raise admin.AdminError("XX000", f"IMP {cmd.kind} failed: {exc}") from exc
    raise admin.AdminError("0A000", f"IMP {cmd.kind} is not supported")
