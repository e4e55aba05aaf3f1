"""A batch of statements sent as one libpq pipeline, below psycopg's ``Connection.pipeline()``.

Why: a maintenance reads its deltas with a handful of statements in one round trip
(:func:`sketches.deltas.read_batch`). Through psycopg's pipeline API every statement costs a
cursor and a generator-driven send and fetch in Python; measured on this project's machine that
was about 0.25 ms per batch, as much as PostgreSQL's own work for a 10-row delta (scratch:
0.59 → 0.35 ms per read). Here each statement is one libpq call (``psycopg.pq``), the round
trip is one wait on the socket, and the rows are loaded by psycopg's own ``Transformer``, so
they come back as the same Python values a cursor returns.

Contract: :func:`run` sends every :class:`Step` and a Sync, and returns one entry per step:
its rows, or None for a statement that returns none. A step that fails makes PostgreSQL skip
the rest (pipeline semantics) and :func:`run` raises :class:`BatchFailed` with PostgreSQL's
SQLSTATE and message once every result has been read; the connection is then out of pipeline
mode and the caller's transaction (if any) is aborted, exactly as after a failed statement.
Named statements are prepared on first use, per connection, and reused (``prepared=True``
steps, unless the connection's ``prepare_threshold`` is None: then nothing is prepared).
The waits release the GIL, so a proxy's event loop keeps running meanwhile.

:func:`fetch` runs one statement the same way, for the library's reads outside a batch: on a
connection where this module prepares, psycopg must prepare nothing itself (see there).
"""

from __future__ import annotations

import itertools
import re
import select
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq
from psycopg.adapt import PyFormat, Transformer
from psycopg.pq.abc import PGconn, PGresult

Rows = list[tuple[Any, ...]]
Conn = psycopg.Connection[Any]

PREPARE_WHEN_ASKED = 2**62
"""A connection's ``prepare_threshold`` for the library's own connections (the proxy's service
connections, the maintenance thread's): psycopg then prepares only what is run with
``prepare=True`` or ``executemany``, never by count, and the library runs neither there
(:func:`fetch`): psycopg holds no prepared statement, so it never sends ``DEALLOCATE ALL``.
Why not by count: each use may have another search_path, and a cached plan must not change
its result type; a delta read names its tables with their schemas."""

MAX_PREPARED = 128
"""Named statements kept per connection; the least recently used beyond it are closed."""

_ES = pq.ExecStatus
_OK = frozenset((_ES.COMMAND_OK, _ES.TUPLES_OK, _ES.EMPTY_QUERY))
_INVALID_NAME = "26000"  # invalid_sql_statement_name: the server lost our statement


class BatchFailed(psycopg.Error):
    """A step of the batch failed in PostgreSQL (``sqlstate``, ``message``); the steps after
    it were not run. A :class:`psycopg.Error`, so callers that undo a failed read on any
    database error undo this one too."""

    def __init__(self, step: int, sqlstate: str | None, message: str,
                 error: psycopg.Error) -> None:
        super().__init__(f"step {step}: {message}")
        self.step = step
        self.sqlstate = sqlstate
        self.message = message
        self.error = error
        """What psycopg raises for the same result (its class per SQLSTATE)."""


class PipelineBusy(psycopg.InterfaceError):
    """The connection is already in pipeline mode (psycopg's or another batch)."""


@dataclass(frozen=True, slots=True)
class Step:
    """One statement: ``text`` with ``$n`` placeholders, its ``params`` in PostgreSQL's text
    format (None: NULL) and their type oids ``types`` (empty, or 0 for one: PostgreSQL infers
    it, as for an untyped literal), ``prepared``: run as a named statement prepared once per
    connection (utility statements such as SAVEPOINT are not worth a name)."""

    text: bytes
    params: tuple[bytes | None, ...] = ()
    types: tuple[int, ...] = ()
    prepared: bool = True


class _Names:
    """The named statements this module prepared on one connection (text → name), least
    recently used first, and the names evicted but not yet closed on the server."""

    _counter = itertools.count(1)

    def __init__(self) -> None:
        self.by_text: OrderedDict[tuple[bytes, tuple[int, ...]], bytes] = OrderedDict()
        self.closing: list[bytes] = []

    def get(self, step: Step) -> tuple[bytes, bool]:
        """The statement's name, and whether it must be prepared first."""
        key = (step.text, step.types)
        name = self.by_text.get(key)
        if name is not None:
            self.by_text.move_to_end(key)
            return name, False
        name = b"_imp_p%d" % next(self._counter)
        self.by_text[key] = name
        while len(self.by_text) > MAX_PREPARED:
            self.closing.append(self.by_text.popitem(last=False)[1])
        return name, True

    def forget(self, step: Step) -> None:
        self.by_text.pop((step.text, step.types), None)


_registry: weakref.WeakKeyDictionary[Conn, _Names] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


def _names(conn: Conn) -> _Names:
    with _registry_lock:
        names = _registry.get(conn)
        if names is None:
            names = _registry[conn] = _Names()
        return names


def forget_all(conn: Conn) -> None:
    """Forgets the statements prepared on ``conn`` (after ``DISCARD ALL`` or
    ``DEALLOCATE ALL`` on it); they are prepared again on next use."""
    with _registry_lock:
        _registry.pop(conn, None)


_PLACEHOLDER = re.compile(rb"%%|%\(since\)s|%s|%")


def dollar(text: bytes) -> bytes:
    """A psycopg query text (``%s`` positional or ``%(since)s`` named placeholders, ``%%`` a
    literal percent sign) with ``$n`` placeholders instead, for :class:`Step`. Raises
    ValueError for other placeholders or for both kinds in one text."""
    positional = 0
    named = False

    def sub(m: re.Match[bytes]) -> bytes:
        nonlocal positional, named
        token = m.group()
        if token == b"%%":
            return b"%"
        if token == b"%(since)s":
            named = True
            return b"$1"
        if token == b"%s":
            positional += 1
            return b"$%d" % positional
        raise ValueError(f"unsupported placeholder in {text[:80]!r}")

    out = _PLACEHOLDER.sub(sub, text)
    if named and positional:
        raise ValueError("named and positional placeholders in one query")
    return out


def bound(conn: Conn, text: bytes, params: Sequence[Any], prepared: bool = True) -> Step:
    """A :class:`Step` of ``text`` with ``params`` dumped by psycopg's own adapters (text
    format), typed as psycopg types them, so PostgreSQL sees what a cursor would send."""
    if not params:
        return Step(text, prepared=prepared)
    tx = Transformer(conn)
    dumped = tx.dump_sequence(params, [PyFormat.TEXT] * len(params))
    return Step(text, tuple(None if p is None else bytes(p) for p in dumped),
                tuple(tx.types or ()), prepared)


def fetch(conn: Conn, query: str | bytes, params: Sequence[Any] | None = None) -> Rows:
    """``conn.execute(query, params, prepare=True).fetchall()``: the same rows, and the
    exception psycopg raises for a PostgreSQL error; on a connection whose
    ``prepare_threshold`` is :data:`PREPARE_WHEN_ASKED`, prepared by this module instead.

    Why: psycopg answers a command tagged ROLLBACK (also ``ROLLBACK TO SAVEPOINT``,
    ``conn.rollback()``), DROP or ALTER on a connection where it holds prepared statements
    with ``DEALLOCATE ALL``, which drops this module's statements too, and every batch on that
    connection then fails once (and takes its caller's long way). On such a connection psycopg
    holds none, so it never does. On others psycopg may prepare by count anyway, and a
    statement dropped behind this module's back inside a transaction could not be run again:
    psycopg prepares there, as before. ``query`` has psycopg's ``%s`` placeholders when
    ``params`` is not None (as for psycopg, also when empty); a str is encoded in the
    connection's encoding. Outside a transaction that psycopg would open first, psycopg runs
    it (opening it), unprepared."""
    threshold = conn.prepare_threshold
    mine = threshold is not None and threshold >= PREPARE_WHEN_ASKED
    if not mine or (not conn.autocommit
                    and conn.info.transaction_status == pq.TransactionStatus.IDLE):
        return conn.execute(query, params, prepare=not mine).fetchall()
    text = query.encode(conn.info.encoding) if isinstance(query, str) else query
    step = Step(text) if params is None else bound(conn, dollar(text), params)
    try:
        rows = run(conn, [step])[0]
    except BatchFailed as exc:
        raise exc.error from None
    return rows or []


def run(conn: Conn, steps: Sequence[Step]) -> list[Rows | None]:
    """Sends ``steps`` as one pipeline and returns each one's rows (see the module's
    contract). Raises :class:`BatchFailed` when a step failed, psycopg's OperationalError
    when the connection broke."""
    with conn.lock:
        pg = conn.pgconn
        if pg.pipeline_status != pq.PipelineStatus.OFF:
            raise PipelineBusy("the connection is already in pipeline mode")
        names = _names(conn) if conn.prepare_threshold is not None else None
        kinds = _send(pg, steps, names)
        results = _collect(pg)
    return _outcome(conn, steps, kinds, results, names)


# what each sent command was, to pair it with its result
_CLOSE, _PREPARE, _EXEC = 0, 1, 2


def _send(pg: PGconn, steps: Sequence[Step],
          names: _Names | None) -> list[tuple[int, int]]:
    """Queues every command and the Sync; returns (kind, step index) per command."""
    kinds: list[tuple[int, int]] = []
    pg.enter_pipeline_mode()
    try:
        if names is not None:
            for name in names.closing:
                pg.send_close_prepared(name)
                kinds.append((_CLOSE, -1))
            names.closing.clear()
        for i, step in enumerate(steps):
            params = list(step.params) if step.params else None
            types = list(step.types) if step.types else None
            if names is None or not step.prepared:
                pg.send_query_params(step.text, params, types)
            else:
                name, new = names.get(step)
                if new:
                    pg.send_prepare(name, step.text, types)
                    kinds.append((_PREPARE, i))
                pg.send_query_prepared(name, params)
            kinds.append((_EXEC, i))
        pg.pipeline_sync()
        _flush(pg)
    except BaseException:
        _abandon(pg)
        raise
    return kinds


def _flush(pg: PGconn) -> None:
    while pg.flush() != 0:
        readable, _w, _x = select.select([pg.socket], [pg.socket], [])
        if readable:
            pg.consume_input()


def _collect(pg: PGconn) -> list[PGresult]:
    """Every result up to the Sync's, waiting on the socket (GIL released) whenever libpq
    would block; then leaves pipeline mode."""
    results: list[PGresult] = []
    try:
        while True:
            while pg.is_busy():
                select.select([pg.socket], [], [])
                pg.consume_input()
            res = pg.get_result()
            if res is None:
                continue
            if res.status == _ES.PIPELINE_SYNC:
                break
            results.append(res)
    except BaseException:
        _abandon(pg)
        raise
    pg.exit_pipeline_mode()
    return results


def _abandon(pg: PGconn) -> None:
    """Leaves pipeline mode after an exception, if libpq lets it (a broken connection is
    reported by psycopg on its next use)."""
    try:
        pg.exit_pipeline_mode()
    except psycopg.Error:
        pass


def _outcome(conn: Conn, steps: Sequence[Step], kinds: list[tuple[int, int]],
             results: list[PGresult], names: _Names | None) -> list[Rows | None]:
    out: list[Rows | None] = [None] * len(steps)
    failure: BatchFailed | None = None
    tx = Transformer(conn)
    for (kind, i), res in zip(kinds, results, strict=True):
        if res.status not in _OK:
            if kind == _PREPARE and names is not None:
                names.forget(steps[i])   # never prepared: prepare it again next time
            if failure is None and res.status == _ES.FATAL_ERROR:
                failure = _failure(conn, i, res)
            continue
        if kind == _EXEC and res.status == _ES.TUPLES_OK:
            tx.set_pgresult(res)
            out[i] = tx.load_rows(0, res.ntuples, tuple)
    if failure is not None:
        if failure.sqlstate == _INVALID_NAME:
            forget_all(conn)
        raise failure
    return out


def _failure(conn: Conn, step: int, res: PGresult) -> BatchFailed:
    def field(f: pq.DiagnosticField) -> str | None:
        value = res.error_field(f)
        return None if value is None else value.decode(conn.info.encoding, "replace")
    message = field(pq.DiagnosticField.MESSAGE_PRIMARY) or res.error_message.decode(
        conn.info.encoding, "replace")
    return BatchFailed(step, field(pq.DiagnosticField.SQLSTATE), message,
                       psycopg.errors.error_from_result(res, encoding=conn.info.encoding))
