"""Routing: which client statements the proxy touches, and the seam to the sketch library.

The relay asks the router two things: a *cheap* synchronous question on the hot path ("could
this query text ever be sketched?": a lexical pre-filter plus the per-text decision cache), and
the expensive ones (``classify``, ``prepare``) in worker threads. The sketch library is reached
only through :class:`SketchHook`, whose methods match ``sketches.manager.SketchManager``
(docs/INTERFACES.md §1).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
from psycopg import sql as pgsql
from psycopg_pool import ConnectionPool, PoolTimeout

from sketches import service
from sketches.lookup import search_path_schemas
from sketches.lru import Lru
from sketches.pipelined import PREPARE_WHEN_ASKED
from sketches.service import LOCAL_SETTINGS, SERVICE_LOCK_WAIT, ServiceConnection

from .admin import AdminError

log = logging.getLogger(__name__)


class ClassificationLike(Protocol):
    @property
    def candidate(self) -> bool: ...
    @property
    def reason(self) -> str: ...
    @property
    def template(self) -> str | None: ...


class PreparedLike(Protocol):
    @property
    def decision(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def sketch_id(self) -> int | None: ...
    @property
    def instrumented_sql(self) -> str | None: ...


class SketchHook(Protocol):
    """What the proxy needs from the sketch library (``SketchManager`` satisfies it)."""

    def classify(self, sql: str) -> ClassificationLike: ...

    def prepare(self, conn: psycopg.Connection[Any], sql: str,
                params: Sequence[object] | None = None,
                search_path: str | None = None) -> PreparedLike: ...

    def sketches(self) -> list[dict[str, object]]: ...

    def stats(self) -> dict[str, object]: ...

    def drop(self, conn: psycopg.Connection[Any], sketch_id: int) -> bool: ...

    def drop_all(self, conn: psycopg.Connection[Any]) -> int: ...


@dataclass(frozen=True, slots=True)
class Decision:
    """The cached outcome of ``classify`` for one query text."""

    candidate: bool
    reason: str
    template: str | None = None
    lock: str | None = None
    """``LOCK TABLE … IN ACCESS SHARE MODE`` of the query's tables (:func:`lock_statement`)."""


@dataclass(frozen=True, slots=True)
class PrepareOutcome:
    decision: str
    reason: str
    sketch_id: int | None
    instrumented_sql: str | None
    details: tuple[tuple[str, object], ...] = ()
    """Extra ``IMP EXPLAIN`` rows (the hook's optional ``explain_backend``: where a capture
    would run, and why)."""


TEMPORAL_SETTINGS = ("TimeZone", "DateStyle", "IntervalStyle")
"""Settings that change only what date, time and interval text means (``'2020-01-01'`` as a
timestamptz, a date's field order, an interval's text): a hook that says it
``handles_other_settings`` serves a session with other values for the queries that read no
such value."""

EVALUATION_SETTINGS = TEMPORAL_SETTINGS + ("standard_conforming_strings",)
"""Settings that change what a query's constants mean (the temporal ones; a backslash in
``'a\\b'``, an escape where standard_conforming_strings is off); PostgreSQL reports each
(ParameterStatus), so a service connection knows its own without a query."""

UNREPORTED_SETTINGS = ("array_nulls", "transform_null_equals", "timezone_abbreviations",
                       "lc_monetary", "extra_float_digits", "bytea_output")
"""Settings that change how a query's text is read (``NULL`` in an array literal, ``x = NULL``,
``'2020-01-01 EST'``, a money literal) or what a value's text is (``x::text`` of a float,
rounded where extra_float_digits ≤ 0, and of a bytea), which PostgreSQL does not report: the
service connection reads its own in the transaction's setup."""

_SETTING_SQL = {
    "extra_float_digits": ("least(pg_catalog.current_setting('extra_float_digits')"
                           "::pg_catalog.int4, 1)::pg_catalog.text"),
}
"""Settings read as an expression, not as their text: every positive extra_float_digits gives
the same float text (the shortest exact one), so pgjdbc's 3 and the default 1 are one value."""


def setting_sql(name: str) -> str:
    """The SQL expression that reads setting ``name`` (one of :data:`SESSION_SETTINGS`) in the
    form sessions are compared on."""
    return _SETTING_SQL.get(name, f"pg_catalog.current_setting('{name}')")

SESSION_SETTINGS = EVALUATION_SETTINGS + UNREPORTED_SETTINGS
"""What a client session's settings are compared with the service connection's on."""


def _settings_differ(client: tuple[str, ...], service: tuple[str, ...]) -> PrepareOutcome:
    diff = ", ".join(f"{n} {c!r} (service connection: {v!r})"
                     for n, c, v in zip(SESSION_SETTINGS, client, service, strict=True)
                     if c != v)
    return PrepareOutcome("passthrough", f"the session's {diff}: a sketch captured under the "
                          "service connection's settings need not hold", None, None)


_READ_UNREPORTED = pgsql.SQL("SELECT {}").format(pgsql.SQL(", ").join(
    pgsql.SQL(setting_sql(n)) for n in UNREPORTED_SETTINGS))


def _read_unreported_and_path(schemas: list[str]) -> pgsql.Composable:
    """The unreported settings, then whether the service role resolves names through
    ``schemas`` (the client's) once the client's search_path is set: PostgreSQL leaves out
    the schemas a role may not use. (An array comparison: the path's text built anew costs a
    subquery's planning, about 25 µs.)"""
    return pgsql.SQL("SELECT {}, pg_catalog.current_schemas(true)::pg_catalog.text[]"
                     " OPERATOR(pg_catalog.=) {}::pg_catalog.text[]").format(
        pgsql.SQL(", ").join(pgsql.SQL(setting_sql(n)) for n in UNREPORTED_SETTINGS),
        pgsql.Literal(schemas))


LOCK_QUEUED = ("another session's lock request on the query's tables queued behind the "
               "wrapping's own: the proxy's connection would wait for it, and it for the "
               "client's backend, which waits for the proxy")
"""Why a query passes through when the service transaction cannot have its tables at once.
Why it asks: a TRUNCATE or ALTER queued behind the ACCESS SHARE lock a wrapping holds on the
client's backend queues every later request on the table, the service connection's read too,
and that wait runs through the proxy, where PostgreSQL's deadlock detector cannot see it: the
peer's DDL waited up to ``SERVICE_LOCK_WAIT`` (2 s), and one with a shorter ``lock_timeout``
failed (found by a helper's search). Taken first, in the setup's round trip, the tables are
held before any such request can queue in between, or the request is seen at once."""


def _path_differs(client: str) -> PrepareOutcome:
    return PrepareOutcome("passthrough", f"the service role does not resolve names through "
                          f"the session's search_path {client!r} (it may not use a schema "
                          "there): it would read other tables or operators", None, None)


def lock_statement(tables: Sequence[tuple[str | None, str]]) -> str | None:
    """``LOCK TABLE`` of ``tables`` (schema or None, name) ``IN ACCESS SHARE MODE NOWAIT``;
    None without tables.

    Why: PostgreSQL takes an autocommit query's snapshot once the query holds its locks, so
    a query that waited behind a TRUNCATE or an ALTER reads what that transaction committed,
    and none can commit between its snapshot and its read. The wrapping's REPEATABLE READ
    snapshot was taken before the instrumented query took its locks: after a wait behind a
    ``TRUNCATE; INSERT …`` it read the new table, empty to its snapshot (found by a helper's
    search in session 24: no rows instead of 60 groups). ``LOCK`` takes no snapshot, so it
    goes between ``BEGIN`` and the snapshot's export. ``NOWAIT``: ``LOCK`` also locks every
    partition, inheritance child and a view's tables, which the query may not (a partition
    it prunes, ``ONLY``); so it never waits, and a lock held by another session makes the
    query pass through, to wait for its own locks as PostgreSQL has it."""
    if not tables:
        return None
    names = [pgsql.Identifier(name) if schema is None else pgsql.Identifier(schema, name)
             for schema, name in tables]
    return pgsql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE NOWAIT").format(
        pgsql.SQL(", ").join(names)).as_string()


class PerDatabase:
    """One hook instance per database, behind the ``SketchHook`` interface.

    A hook's state (templates, sketches, range partitions, catalog installation) belongs to one
    database, while one proxy serves every database of its cluster: a single shared
    ``SketchManager`` used the sketch of ``t`` captured in one database to rewrite the same
    query text on another database's ``t`` — wrong answers — and listed every database's
    sketches (query texts) in any database's ``IMP SHOW SKETCHES``. ``classify`` looks at the
    text only and uses one shared instance.
    """

    def __init__(self, factory: Any) -> None:
        self._factory = factory
        self._classifier: SketchHook = factory()
        self._hooks: dict[str, SketchHook] = {}
        # IMP SET's library settings, replayed on each new database's hook: the latest value
        # per name, in the order of first appearance (a list grew by one per IMP SET)
        self._settings: dict[str, str] = {}
        self._lock = threading.Lock()
        if not callable(getattr(self._classifier, "configure", None)):
            self.configure = None  # type: ignore[assignment]  # Router checks for it

    def for_database(self, dbname: str) -> SketchHook:
        with self._lock:
            hook = self._hooks.get(dbname)
            if hook is None:
                hook = self._factory()
                for name, value in self._settings.items():
                    hook.configure(name, value)
                self._hooks[dbname] = hook
            return hook

    @staticmethod
    def _dbname(conn: psycopg.Connection[Any]) -> str:
        return str(conn.info.dbname)

    def classify(self, sql: str) -> ClassificationLike:
        return self._classifier.classify(sql)

    def prepare(self, conn: psycopg.Connection[Any], sql: str,
                params: Sequence[object] | None = None,
                search_path: str | None = None, **kwargs: Any) -> PreparedLike:
        return self.for_database(self._dbname(conn)).prepare(conn, sql, params, search_path,
                                                             **kwargs)

    def sketches(self) -> list[dict[str, object]]:
        with self._lock:
            hooks = list(self._hooks.values())
        return [row for h in hooks for row in h.sketches()]

    def stats(self) -> dict[str, object]:
        return self._classifier.stats()

    def drop(self, conn: psycopg.Connection[Any], sketch_id: int) -> bool:
        return self.for_database(self._dbname(conn)).drop(conn, sketch_id)

    def drop_all(self, conn: psycopg.Connection[Any]) -> int:
        return self.for_database(self._dbname(conn)).drop_all(conn)

    def hooks(self) -> list[SketchHook]:
        with self._lock:
            return [self._classifier, *self._hooks.values()]

    def release(self, dbname: str) -> bool:
        """Forgets ``dbname``'s hook after stopping its background work (its optional
        ``close()``, which saves what it can); the next query there starts a new one, which
        loads the database's catalog as a restarted proxy does. True when there was one."""
        with self._lock:
            hook = self._hooks.pop(dbname, None)
        fn = getattr(hook, "close", None)
        if callable(fn):
            fn()
        return hook is not None

    def settings(self) -> list[tuple[str, str]]:
        """The library settings a new database's hook is given (:meth:`configure`)."""
        with self._lock:
            return list(self._settings.items())

    def configure(self, name: str, value: str) -> None:
        """Applies a library setting to every database's hook, now and later."""
        self._classifier.configure(name, value)  # type: ignore[attr-defined]  # validates
        with self._lock:
            self._settings[name] = value
            hooks = list(self._hooks.values())
        for h in hooks:
            h.configure(name, value)  # type: ignore[attr-defined]


SERVICE_BACKOFF = 30.0  # seconds a database is skipped after its service pool failed
SERVICE_BUSY_WAIT = 1.0
"""Seconds a query waits for a service connection when every one is in use (not failing),
then passes through. Why: prepares waiting for their template's lock (a capture that waits
for another session's lock) each hold one, and a query of another template waited the pool's
whole connect timeout (found: an unrelated query 9.8 s behind eight captures waiting for a
locked table; the old code then turned sketching off for the database for 30 s)."""


class ServiceError(RuntimeError):
    """The proxy's service connection failed (pool exhausted, upstream unreachable)."""


class PrepareCancelled(RuntimeError):
    """The client cancelled its query before a service connection started preparing it."""


class ServiceCancel:
    """Carries a client's CancelRequest to the service connection preparing its query.

    Why: while a service connection captures, the client's backend waits idle in the proxy's
    transaction, where PostgreSQL ignores a cancel; the capture (seconds on a large table, or
    waiting on a lock) ran to its end before the client got its ``57014``. A cancel now
    interrupts the service connection's statements, the prepare fails and the wrapping answers
    the cancel at once.

    PostgreSQL drops a cancel that reaches a backend between statements (the prepare computing
    in Python), so it is sent again every :data:`CANCEL_REPEAT` seconds until the prepare lets
    go of the connection. Thread-safe: :meth:`cancel` runs in one worker thread, the prepare in
    another; the connection is detached under the same lock, so a cancel is only sent to a
    connection still preparing this client's query (a signal PostgreSQL delivers late may
    still reach that connection's next statement, whose prepare then passes its query through:
    slower, never wrong)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._released = threading.Event()
        self.requested = threading.Event()
        """Set by :meth:`cancel`; a sketch library that takes a ``stop`` event stops waiting
        for another prepare of the query's template when it is set."""

    @contextlib.contextmanager
    def attached(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        """``conn`` may be cancelled inside; raises :class:`PrepareCancelled` at once when
        the client cancelled already."""
        with self._lock:
            if self.requested.is_set():
                raise PrepareCancelled("the client cancelled its query")
            self._conn = conn
        try:
            yield
        finally:
            with self._lock:
                self._conn = None
                self._released.set()

    def cancel(self) -> None:
        """Blocking (each round opens a connection to PostgreSQL): run it in a worker
        thread."""
        with self._lock:
            self.requested.set()
        while True:
            with self._lock:
                if self._conn is None:
                    return
                try:
                    self._conn.cancel_safe(timeout=CANCEL_TIMEOUT)
                except psycopg.Error as exc:
                    log.warning("cancelling a service connection's prepare failed: %s", exc)
                    return
            if self._released.wait(CANCEL_REPEAT):
                return


CANCEL_TIMEOUT = 5.0  # seconds to deliver a cancel to a service connection
CANCEL_REPEAT = 0.2  # seconds between cancels of a prepare still running


# A query can only be sketched if it is a SELECT (or WITH/parenthesised SELECT) that groups,
# orders or limits; everything else skips the decision cache and the library entirely.
_SELECTISH = re.compile(rb"\A(?:\s|--[^\n]*(?:\n|\Z)|/\*.*?\*/)*(?:select|with|\()",
                        re.IGNORECASE | re.DOTALL)
"""A SELECT, WITH or parenthesis first, after blanks and comments (found: a query that began
with a comment always passed through, though ``IMP EXPLAIN`` said it would be captured). A
nested comment may end early here: then a text is let through that the parser reads whole."""
_SHAPE = re.compile(rb"\b(?:group|order|having|limit|fetch|distinct)\b")  # on lower case


def prefilter(sql: bytes) -> bool:
    """Cheap lexical gate (about a µs) before the decision cache and any parsing. It runs on
    every SELECT the relay sees while sketching is on: the keyword search runs on a lowered
    copy (``bytes.lower`` folds ASCII only, as ``re.IGNORECASE`` does for bytes), about twice
    as fast as a case-insensitive pattern."""
    if not _SELECTISH.match(sql):
        return False
    body = sql.rstrip().rstrip(b";")
    if b";" in body:  # several statements (or a ';' in a literal): never wrap
        return False
    return _SHAPE.search(body.lower()) is not None


class ServicePools:
    """psycopg_pool connection pools to the upstream, one per database, opened lazily.

    Service connections run as the configured upstream user (the DSN's), never as the client.
    """

    def __init__(self, upstream_dsn: str, max_size: int, connect_timeout: float) -> None:
        self._dsn = upstream_dsn
        self._max = max_size
        self._timeout = connect_timeout
        self._pools: dict[str, ConnectionPool[ServiceConnection[Any]]] = {}
        self._lock = threading.Lock()

    def pool(self, dbname: str) -> ConnectionPool[ServiceConnection[Any]]:
        with self._lock:
            p = self._pools.get(dbname)
            if p is None:
                conninfo = psycopg.conninfo.make_conninfo(self._dsn, dbname=dbname)
                p = ConnectionPool(conninfo, connection_class=ServiceConnection, min_size=1,
                                   max_size=self._max, open=True,
                                   kwargs={"autocommit": True,
                                           "prepare_threshold": PREPARE_WHEN_ASKED,
                                           "connect_timeout": max(1, int(self._timeout))},
                                   timeout=self._timeout, name=f"imp-service-{dbname}")
                self._pools[dbname] = p
            return p

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for p in pools:
            p.close()

    def discard(self, dbname: str) -> bool:
        """Closes ``dbname``'s pool (a connection in use closes when it is returned); the
        next :meth:`pool` call opens a new one. True when there was one."""
        with self._lock:
            p = self._pools.pop(dbname, None)
        if p is not None:
            p.close()
        return p is not None


_WRITABLE = ("SELECT pg_catalog.pg_is_in_recovery()"
             " OR pg_catalog.current_setting('transaction_read_only')::bool")
"""Is the server read-only to the service role (asked inside a transaction)?"""
_NEVER_ASKED = (0.0, "")
_PROTOCOL_VIOLATION = "08P01"


class Router:
    """Decision cache + the blocking calls into the hook, run in worker threads."""

    def __init__(self, hook: SketchHook | None, pools: ServicePools | None,
                 cache_size: int = 10000) -> None:
        self.hook = hook
        self.pools = pools
        self._cache: Lru[str, Decision] = Lru(cache_size)
        self._lock = threading.Lock()
        self._service_down: dict[str, float] = {}
        self._service_settings: dict[str, tuple[str, ...]] = {}
        # per database: None (its queries may be wrapped) or (when to ask again, why not)
        self._refusals: dict[str, tuple[float, str] | None] = {}
        self.counters: dict[str, int] = {
            "queries_classified": 0, "wrapped": 0, "used": 0, "captured": 0,
            "answered_in_memory": 0, "passthrough": 0, "fallbacks": 0, "admin_commands": 0,
            "connections": 0, "cancelled": 0,
        }

    def count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counters[key] = self.counters.get(key, 0) + n

    # ---- hot path -------------------------------------------------------------------------

    def cached(self, sql: str) -> Decision | None:
        return self._cache.get(sql)

    # ---- worker-thread calls --------------------------------------------------------------

    def refuse(self, sql: str, reason: str) -> None:
        """From now on ``sql`` is no candidate (while its decision stays cached): its tables
        cannot be locked as the wrapping must (a materialized view, a foreign table)."""
        self._cache.put(sql, Decision(False, reason))

    async def classify(self, sql: str, dbname: str | None = None) -> Decision:
        """The decision for ``sql``, cached by text. With ``dbname`` (a query without
        parameters, on an idle backend), a text not seen before is first offered to
        ``dbname``'s hook's optional ``decline_unpaid``: a first sight whose capture would go
        unused (its template's last captures were not used again) is declined in the same
        worker-thread call, before the text is analysed and without the wrapping's round
        trips, and that decision is not cached (the text's second execution is captured).
        Why: such a query cost about 4 ms more than relayed (``bench/results/unreused-s30``),
        most of it the analysis and the wrapping of a query that then passed through."""
        hit = self.cached(sql)
        if hit is not None:
            return hit
        if self.hook is None:
            return Decision(False, "no sketch library configured")
        d, keep = await asyncio.to_thread(self._classify_blocking, sql, dbname)
        if keep:
            self._cache.put(sql, d)
        return d

    def _classify_blocking(self, sql: str, dbname: str | None) -> tuple[Decision, bool]:
        """The decision and whether to cache it (see :meth:`classify`)."""
        declined = self._declined(sql, dbname)
        if declined is not None:
            return declined, False
        return self._classified(sql), True

    def _declined(self, sql: str, dbname: str | None) -> Decision | None:
        decline = None if dbname is None else getattr(self._hook_for(dbname),
                                                      "decline_unpaid", None)
        if decline is None:
            return None
        try:
            p = decline(sql, None)
        except Exception as exc:  # noqa: BLE001 - any library failure: classify as usual
            log.warning("decline_unpaid failed, classifying: %s", exc)
            return None
        if p is None:
            return None
        self.count("declined_at_first_sight")
        return Decision(False, str(p.reason))

    def _classified(self, sql: str) -> Decision:
        assert self.hook is not None
        self.count("queries_classified")
        try:
            c = self.hook.classify(sql)
        except Exception as exc:  # noqa: BLE001 - any library failure means: pass through
            log.warning("classify failed, passing through: %s", exc)
            return Decision(False, f"classify failed: {exc}")
        return Decision(bool(c.candidate), str(c.reason), c.template,
                        lock_statement(getattr(c, "tables", ())))

    async def prepare(self, dbname: str, snapshot: str, search_path: str | None, sql: str,
                      params: Sequence[object] | None, explain: bool = False,
                      snapshot_text: str | None = None,
                      settings: tuple[str, ...] | None = None,
                      started: str | None = None,
                      cancel: Callable[[], ServiceCancel] | None = None,
                      lock_timeout: str = "0", role: str | None = None,
                      lock: str | None = None) -> PrepareOutcome:
        """``snapshot``: the exported snapshot's id; ``snapshot_text``: its
        ``pg_current_snapshot()``, with which the hook may answer from memory (its optional
        ``prepare_cached``) instead of on a service connection. ``explain``: also ask the
        hook where a capture would run (``IMP EXPLAIN``). ``settings``: the client session's
        ``SESSION_SETTINGS``; when they differ from the service connections', the query
        passes through (a sketch captured or kept under the one need not hold under the
        other: ``'2020-01-01'`` is another instant in another TimeZone) — unless only
        ``TEMPORAL_SETTINGS`` differ and the hook ``handles_other_settings``: then it is
        asked (from memory only with an answer for a query those settings do not concern)
        and passes through the queries they concern. ``started``: the server's start time
        and the database's oid (``lookup.SERVER_INSTANCE``), told to a hook that tracks
        restarts (its optional ``server_started``) before anything is answered from memory.
        ``cancel``: called (on
        the event loop) when the prepare goes to a service connection, for the
        :class:`ServiceCancel` that lets the client's CancelRequest interrupt its work (an
        answer from memory needs none). ``lock_timeout``: the client's, which the service
        transaction takes too: a capture waiting longer for a lock fails and the client's own
        query meets the lock under its own timeout. ``role``: the client's ``current_user``,
        told to a hook that ``checks_role`` (``prepare(…, role=)``): it does no work on the
        service role's authority (a capture) for a query that role may not run. ``lock``:
        the wrapping's ``LOCK … NOWAIT`` of the query's tables, which the service
        transaction takes first too (see :data:`LOCK_QUEUED`)."""
        hook = self._hook_for(dbname)
        if started:
            note = getattr(hook, "server_started", None)
            if note is not None:
                note(started)
        known = self._service_settings.get(dbname)
        relaxed = False
        if settings is not None and known is not None and known != settings:
            if self._temporal_only(dbname, settings, known) is None:
                return _settings_differ(settings, known)
            relaxed = True
        cached = getattr(hook, "prepare_cached", None)
        if cached is None or search_path is None:
            snapshot_text = None  # a hook without it reads the snapshot itself
        elif snapshot_text is not None and not explain and (known == settings or relaxed):
            p = cached(sql, params, search_path, snapshot_text,
                       **({"settings_differ": True} if relaxed else {}))
            if p is not None:
                self.count("answered_in_memory")
                return PrepareOutcome(str(p.decision), str(p.reason), p.sketch_id,
                                      p.instrumented_sql)
        return await asyncio.to_thread(self._prepare_blocking, dbname, snapshot, search_path,
                                       sql, params, explain, snapshot_text, settings,
                                       cancel() if cancel is not None else None, lock_timeout,
                                       role, lock)

    def _prepare_blocking(self, dbname: str, snapshot: str, search_path: str | None, sql: str,
                          params: Sequence[object] | None, explain: bool = False,
                          snapshot_text: str | None = None,
                          settings: tuple[str, ...] | None = None,
                          cancel: ServiceCancel | None = None,
                          lock_timeout: str = "0", role: str | None = None,
                          lock: str | None = None) -> PrepareOutcome:
        """``snapshot_text``: given only to a hook with ``prepare_cached``, which also takes
        ``prepare(…, snapshot=)`` — the snapshot's text, which the service connection
        imported, instead of reading it — and ``prepare(…, stop=)``: the cancel's event, which
        ends a wait for another prepare of the query's template."""
        hook, pools = self.hook, self.pools
        if hook is None or pools is None:
            return PrepareOutcome("passthrough", "no sketch library configured", None, None)
        decline = None if explain else getattr(self._hook_for(dbname), "decline_unpaid", None)
        declined = None if decline is None else decline(sql, params)
        if declined is not None:   # a capture that would go unused: no service connection
            return PrepareOutcome(str(declined.decision), str(declined.reason), None, None)
        cancel = cancel or ServiceCancel()
        with self._service(dbname) as conn, cancel.attached(conn):
            reported = tuple(conn.info.parameter_status(n) or "" for n in EVALUATION_SETTINGS)
            if settings is not None:   # the unreported ones are compared after the setup
                assumed = reported + settings[len(reported):]
                if settings != assumed and self._temporal_only(dbname, settings,
                                                               assumed) is None:
                    return _settings_differ(settings, assumed)
            # one round trip (a simple Query of several statements: no parameters)
            setup = [pgsql.SQL("BEGIN ISOLATION LEVEL REPEATABLE READ"),
                     pgsql.SQL("SET TRANSACTION SNAPSHOT {}").format(pgsql.Literal(snapshot)),
                     pgsql.SQL(LOCAL_SETTINGS)]
            if search_path is not None:
                setup.append(pgsql.SQL("SELECT pg_catalog.set_config('search_path', {}, true)")
                             .format(pgsql.Literal(search_path)))
            if lock_timeout != "0":   # a shorter one than the service connection's
                setup.append(pgsql.SQL(
                    "SELECT pg_catalog.set_config('lock_timeout', CASE WHEN"
                    " {c}::pg_catalog.interval OPERATOR(pg_catalog.<) {b}::pg_catalog.interval"
                    " THEN {c} ELSE {b} END, true)").format(
                        c=pgsql.Literal(lock_timeout), b=pgsql.Literal(SERVICE_LOCK_WAIT)))
            schemas = None if search_path is None else search_path_schemas(search_path)
            if search_path is not None and schemas is None:
                return _path_differs(search_path)
            if lock is not None and search_path is not None:
                setup.append(pgsql.SQL(lock))
            setup.append(_READ_UNREPORTED if schemas is None
                         else _read_unreported_and_path(schemas))
            prepared = False
            try:
                try:
                    cur = conn.execute(pgsql.SQL("; ").join(setup))
                except psycopg.errors.LockNotAvailable:
                    conn.execute("ROLLBACK")
                    return PrepareOutcome("passthrough", LOCK_QUEUED, None, None)
                while cur.nextset():   # to the last statement's row
                    pass
                row: tuple[Any, ...] = cur.fetchone() or ()
                if search_path is not None:
                    row, same_path = row[:-1], row[-1]
                    if same_path is not True:
                        conn.execute("ROLLBACK")
                        return _path_differs(search_path)
                own = reported + tuple(str(v) for v in row)
                self._service_settings[dbname] = own
                differ = None if settings is None else self._temporal_only(dbname, settings, own)
                if differ is None and settings is not None and settings != own:
                    conn.execute("ROLLBACK")
                    return _settings_differ(settings, own)
                kwargs: dict[str, Any] = {} if differ is None else {"settings_differ": differ}
                if snapshot_text is not None:
                    kwargs["snapshot"] = snapshot_text
                if hasattr(self._hook_for(dbname), "prepare_cached"):
                    kwargs["stop"] = cancel.requested
                if role is not None and getattr(self._hook_for(dbname), "checks_role", False):
                    kwargs["role"] = role
                if explain and getattr(self._hook_for(dbname), "explains", False):
                    kwargs["explain"] = True
                p = hook.prepare(conn, sql, params, search_path, **kwargs)
                prepared = True
                details = self._explain_backend(dbname, conn, sql, params) if explain else ()
                conn.execute("COMMIT")
                committed = getattr(self._hook_for(dbname), "committed", None)
                if committed is not None:
                    committed()
            except BaseException:
                with contextlib.suppress(psycopg.Error):  # keep the original error
                    conn.execute("ROLLBACK")
                # a prepare that raised undid its own caches; one that returned did not know
                rolled_back = getattr(self._hook_for(dbname), "rolled_back", None)
                if prepared and rolled_back is not None:
                    rolled_back()
                raise
        return PrepareOutcome(str(p.decision), str(p.reason), p.sketch_id, p.instrumented_sql,
                              details)

    def _temporal_only(self, dbname: str, client: tuple[str, ...],
                       service: tuple[str, ...]) -> str | None:
        """Why ``client``'s settings are not ``service``'s, when they differ only in
        ``TEMPORAL_SETTINGS`` and the database's hook serves such sessions (it then passes
        through the queries that read a date, time or interval); None otherwise (also when
        they are equal)."""
        k = len(TEMPORAL_SETTINGS)
        if client == service or client[k:] != service[k:] or not getattr(
                self._hook_for(dbname), "handles_other_settings", False):
            return None
        return _settings_differ(client, service).reason

    def _explain_backend(self, dbname: str, conn: psycopg.Connection[Any], sql: str,
                         params: Sequence[object] | None) -> tuple[tuple[str, object], ...]:
        """The hook's optional ``explain_backend(conn, sql, params)`` rows (heavy_backend,
        heavy_backend_reason); a failure there only shows as the reason."""
        fn = getattr(self._hook_for(dbname), "explain_backend", None)
        if fn is None:
            return ()
        try:
            conn.execute("SAVEPOINT imp_explain_backend")
            rows = tuple((str(k), v) for k, v in fn(conn, sql, params))
            conn.execute("RELEASE SAVEPOINT imp_explain_backend")
        except psycopg.Error as exc:
            log.warning("explaining the heavy backend failed: %s", exc)
            conn.execute("ROLLBACK TO SAVEPOINT imp_explain_backend")
            return (("heavy_backend", None), ("heavy_backend_reason", f"unknown: {exc}"))
        return rows

    async def drop(self, dbname: str, sketch_id: int) -> bool:
        return await asyncio.to_thread(self._with_service, dbname,
                                       lambda h, c: h.drop(c, sketch_id))

    async def drop_all(self, dbname: str) -> int:
        return await asyncio.to_thread(self._with_service, dbname, lambda h, c: h.drop_all(c))

    def _with_service(self, dbname: str, fn: Any) -> Any:
        if self.hook is None or self.pools is None:
            raise ServiceError("no sketch library configured")
        with self._service(dbname) as conn:
            return fn(self.hook, conn)

    async def refused(self, dbname: str) -> str | None:
        """Why no query of ``dbname`` may be wrapped now (None: they may). Asked once per
        database on a service connection, and again after :data:`SERVICE_BACKOFF` seconds
        while refused; a refusal costs one of the proxy's own connections, never a client's.

        * A transaction must stay on one server connection until it ends: the wrapping needs
          that on the client's own connection. Found: behind PgBouncer's statement pooling,
          the wrapping's ``BEGIN`` was answered ``FATAL transaction blocks not allowed in
          statement pooling mode`` and the client's connection closed.
        * The server must take writes: capture and maintenance write schema ``imp``. Found:
          in front of a hot standby (or a database with ``default_transaction_read_only``)
          every sketchable query failed its prepare and logged a WARNING, for ever. A standby
          promoted since is seen by the next asking."""
        if self.pools is None:
            return None
        known = self._refusals.get(dbname, _NEVER_ASKED)
        if known is None:
            return None
        if time.monotonic() < known[0]:
            return known[1]
        why = await asyncio.to_thread(self._ask_service, dbname)
        if why is None:
            self._refusals[dbname] = None
            if known is not _NEVER_ASKED:
                log.info("database %r: queries there are sketched again", dbname)
            return None
        if not why[1]:
            return why[0]   # no service connection now: :meth:`_service` backs off
        if known is _NEVER_ASKED or known[1] != why[0]:
            log.warning("database %r: %s; queries there pass through (asked again every "
                        "%.0f s)", dbname, why[0], SERVICE_BACKOFF)
        self._refusals[dbname] = (time.monotonic() + SERVICE_BACKOFF, why[0])
        return why[0]

    def _ask_service(self, dbname: str) -> tuple[str, bool] | None:
        """None, or (why the database's queries pass through, whether that is the
        database's answer — else the asking failed: no service connection could be had, or
        it broke, as a pooled one whose server restarted does). A transaction that does not
        hold is told by a protocol violation (08P01: PgBouncer's ``transaction blocks not
        allowed in statement pooling mode``)."""
        try:
            with self._service(dbname) as conn:
                # the settings in BEGIN's round trip: a database's short idle-in-transaction
                # timeout ended the connection before the next statement came (found in CI:
                # 1 ms, a fallback); the transaction still stays open, as a pooler must allow
                service.begin(conn, "BEGIN")
                row = conn.execute(_WRITABLE).fetchone()
                conn.execute("ROLLBACK")
        except ServiceError as exc:
            return str(exc), False
        except psycopg.Error as exc:
            why = str(exc).strip()
            if exc.sqlstate == _PROTOCOL_VIOLATION:
                return (f"a transaction through the upstream did not hold ({why}; a statement"
                        " pooler?)", True)
            return f"a service connection failed: {why}", False
        if row is not None and row[0]:
            return "the server is read-only (a standby, or default_transaction_read_only)", True
        return None

    @contextlib.contextmanager
    def _service(self, dbname: str) -> Iterator[psycopg.Connection[Any]]:
        """A pooled service connection. When none can be had (upstream unreachable, the DSN's
        credentials refused), the database is skipped for SERVICE_BACKOFF seconds so candidate
        queries fall back at once instead of each waiting for the pool timeout. When every one
        is in use, a query waits at most SERVICE_BUSY_WAIT and then falls back alone."""
        assert self.pools is not None
        until = self._service_down.get(dbname, 0.0)
        if time.monotonic() < until:
            raise ServiceError(f"service connections to {dbname!r} are failing; "
                               f"retrying in {until - time.monotonic():.0f} s")
        pool = self.pools.pool(dbname)
        stats = pool.get_stats()
        busy = stats.get("pool_size", 0) >= stats.get("pool_max", 1) \
            and stats.get("pool_available", 0) == 0
        try:
            conn = pool.getconn(timeout=SERVICE_BUSY_WAIT if busy else None)
        except PoolTimeout as exc:
            if busy:   # in use, not failing: this query passes through, the next one tries
                self.count("service_busy")
                raise ServiceError(f"every service connection to {dbname!r} is busy") from exc
            self._service_down[dbname] = time.monotonic() + SERVICE_BACKOFF
            log.warning("no service connection for database %r; sketches off there for %.0f s",
                        dbname, SERVICE_BACKOFF)
            raise ServiceError(f"no service connection for {dbname!r}: {exc}") from exc
        self._service_down.pop(dbname, None)
        try:
            yield conn
        finally:
            pool.putconn(conn)  # resets or discards a connection left in a bad state

    def _hook_for(self, dbname: str | None) -> SketchHook | None:
        if isinstance(self.hook, PerDatabase) and dbname is not None:
            return self.hook.for_database(dbname)
        return self.hook

    async def sketches(self, dbname: str | None = None) -> list[dict[str, object]]:
        """The sketches of ``dbname`` (all databases' when None)."""
        hook = self._hook_for(dbname)
        if hook is None:
            return []
        return await asyncio.to_thread(hook.sketches)

    async def stats(self, dbname: str | None = None) -> dict[str, object]:
        hook = self._hook_for(dbname)
        if hook is None:
            return {}
        return await asyncio.to_thread(hook.stats)

    async def configure(self, name: str, value: str) -> None:
        """``IMP SET <name> = <value>`` for a library setting: forwarded to the hook's optional
        ``configure(name, value)`` (KeyError: unknown setting, ValueError: bad value)."""
        fn = getattr(self.hook, "configure", None)
        if fn is None:
            raise AdminError("42704", f"unrecognized IMP setting {name!r}; the proxy knows "
                             "'enabled' and the sketch library accepts no settings")
        try:
            await asyncio.to_thread(fn, name, value)
        except KeyError as exc:
            raise AdminError("42704", f"unrecognized IMP setting {name!r}") from exc
        except ValueError as exc:
            raise AdminError("22023", f"invalid value for IMP setting {name!r}: {exc}") from exc

    async def set_strategy(self, dbname: str, sketch_id: int, strategy: str) -> None:
        """``IMP SET STRATEGY = <s> FOR SKETCH <id>``: the hook's optional
        ``set_strategy(id, strategy | None)`` on the session's database (``default``: follow
        the global setting again)."""
        hook = self._hook_for(dbname)
        fn = getattr(hook, "set_strategy", None)
        if fn is None:
            raise AdminError("0A000", "the sketch library has no per-sketch strategies")
        value = None if strategy == "default" else strategy
        try:
            found = await asyncio.to_thread(fn, sketch_id, value)
        except ValueError as exc:
            raise AdminError("22023", f"invalid strategy: {exc}") from exc
        if not found:
            raise AdminError("42704", f"sketch {sketch_id} does not exist")

    async def release_databases(self, names: Iterable[str]) -> None:
        """Closes every session the proxy holds in the databases ``names`` — their service
        pools and their hooks' background connections — so that a statement needing them to
        itself (:mod:`imp_proxy.databases`) runs as it would without the proxy."""
        await asyncio.to_thread(self._release_blocking, list(names))

    def _release_blocking(self, names: list[str]) -> None:
        for name in names:
            hook = self.hook.release(name) if isinstance(self.hook, PerDatabase) else False
            pool = self.pools.discard(name) if self.pools is not None else False
            self._service_down.pop(name, None)
            self._service_settings.pop(name, None)
            self._refusals.pop(name, None)
            if hook or pool:
                self.count("databases_released")
                log.info("released database %r (service pool: %s, hook: %s)", name, pool, hook)

    def close(self) -> None:
        """Stops the hooks' background work (their optional ``close()``)."""
        hooks = self.hook.hooks() if isinstance(self.hook, PerDatabase) else [self.hook]
        for h in hooks:
            fn = getattr(h, "close", None)
            if callable(fn):
                fn()

    def invalidate(self) -> None:
        """Forgets cached decisions (after DROP SKETCH: decisions do not depend on sketches,
        but a dropped library state may change the reason reported)."""
        self._cache.clear()
