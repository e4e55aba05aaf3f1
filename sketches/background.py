"""The manager's background thread (docs/MAINTENANCE.md): table tracking, eager maintenance,
state persistence and audit-row garbage collection, on its own connection.

Every round (``TICK`` seconds):

1. tracks the tables queued by captures (``imp.track_table`` in its own short transaction; a
   lock timeout puts the table back in the queue for the next round);
2. eager sketches: a sketch is maintained when ``batch_interval`` seconds passed since its last
   maintenance or at least ``batch_size`` delta rows are pending (the two trigger policies of
   intermittent query processing) — in a REPEATABLE READ transaction of its own, under the
   sketch's template lock, exactly as a query would (so versions only move forward);
3. every ``state_interval`` seconds: evicts the sketches no query used for
   ``idle_evict_after`` seconds (``SketchManager.evict_idle``) and invalidates the catalog rows
   of every sketch evicted since the last time, deleting their persisted states
   (``SketchManager.unpersist_evicted``), then persists every state changed since it was last
   saved over audit rows (a version moved without a delta is not worth a commit:
   ``IncrementalMaintenance.worth_saving``), then deletes the audit rows every live state
   covers (``sketches.incremental.collect_garbage``).

A template whose lock is busy (a query is preparing) is skipped for the round. Errors are
logged; the thread keeps running (a broken pipeline is rebuilt by the next query).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import psycopg

from sketches import deltas, incremental, lookup, pipelined
from sketches.ivm import collector
from sketches.ivm.errors import IvmError
from sketches.maintained import ENGINE_BUGS, SAVE_BACKOFF, names_refused
from sketches.service import ServiceConnection

if TYPE_CHECKING:
    from sketches.maintained import Entry as _Entry
    from sketches.maintained import IncrementalMaintenance
    from sketches.maintained import Template as _Template

log = logging.getLogger(__name__)

TICK = 0.25
LOCK_WAIT = 0.05
GIVE_UP = 30  # consecutive failed rounds (with back-off: about ten minutes)


class Background(threading.Thread):
    def __init__(self, manager: IncrementalMaintenance, conninfo: dict[str, Any]) -> None:
        super().__init__(name="imp-maintenance", daemon=True)
        self.manager = manager
        self.conninfo = conninfo
        self._stopping = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        self._last_state = time.monotonic()
        self.rounds = 0
        self._told_unguarded = False   # logged once at INFO: every capture queues tracking

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self.join(timeout)

    def run(self) -> None:
        failures = 0
        while not self._stopping.wait(TICK * (1 + min(failures, 40))):
            try:
                self.round()
                failures = 0
            except psycopg.Error as exc:
                failures += 1
                log.warning("background maintenance round failed (%d in a row): %s",
                            failures, exc)
                self._drop_connection()
                if failures >= GIVE_UP:  # e.g. the database was dropped
                    log.warning("background maintenance stops; the next use restarts it")
                    self.manager.background_ended(self)
                    return
            except Exception:  # noqa: BLE001 - the thread must outlive any one failure
                log.exception("background maintenance round failed")
                self._drop_connection()
        try:
            self.persist_and_collect()
        except Exception as exc:  # noqa: BLE001 - shutting down: log and leave
            log.warning("final state persistence failed: %s", exc)
        self._drop_connection()

    def _connection(self) -> psycopg.Connection[Any]:
        """The thread's connection, opened anew after a failure. A new one first tells the
        manager PostgreSQL's start time and the database's oid (``server_started``), before
        any state is maintained or saved on it: after a crash that lost commits the states
        held in memory count rows that are gone, and saving one made it outlive the restart
        (found: eager maintenance saved such a state, which the next query loaded after
        forgetting its memory — two groups missing from a HAVING answer)."""
        if self._conn is None or self._conn.closed:
            # its own name over the caller's (found: a DSN naming one failed every round
            # with "multiple values for keyword argument", and no table was ever tracked)
            params = {**self.conninfo, "application_name": "imp-maintenance"}
            conn = ServiceConnection.connect(**params, autocommit=True,
                                             prepare_threshold=pipelined.PREPARE_WHEN_ASKED)
            try:
                row = conn.execute("SELECT " + lookup.SERVER_INSTANCE).fetchone()
            except BaseException:
                conn.close()
                raise
            note = getattr(self.manager, "server_started", None)
            if note is not None and row is not None:
                note(str(row[0]))
            # before anything of schema imp is read or written on it (tracking, states, GC):
            # a schema restored from another database is discarded first
            claim = getattr(self.manager, "claim_identity", None)
            if claim is not None:
                try:
                    claim(conn)
                except BaseException:
                    conn.close()
                    raise
            self._conn = conn
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def round(self) -> None:
        self.rounds += 1
        install = getattr(self.manager, "install_deferred", None)
        if install is not None:
            install(self._connection())
        self.track()
        self.build()
        m = self.manager
        for tmpl, entry in m.entries():
            if entry.pipeline is not None and m.strategy_of(entry) == "eager":
                self.maybe_maintain(tmpl, entry)
        if time.monotonic() - self._last_state >= m.settings.state_interval:
            self.persist_and_collect()

    def track(self) -> None:
        queued = self.manager.take_tracking()
        if not queued:
            return
        conn = self._connection()
        for rel, session in queued.items():
            try:
                incremental.track(conn, [rel], session)
            except deltas.Unguarded as exc:   # recapture keeps its sketches: not queued again
                (log.debug if self._told_unguarded else log.info)("%s", exc)
                self._told_unguarded = True
            except psycopg.Error as exc:  # e.g. lock_timeout behind a long writer: retry
                log.info("tracking %s postponed: %s", rel, exc)
                with self.manager._lock:
                    self.manager._to_track.setdefault(rel, session)

    def build(self) -> None:
        """The state builds queries queued (``IncrementalMaintenance.build_queued``), each
        entry's flag cleared whatever happens, so that a failed build is queued again by
        the entry's next query."""
        while not self._stopping.is_set():
            queued = self.manager.take_build()
            if queued is None:
                return
            try:
                self.manager.build_queued(self._connection(), *queued)
            finally:
                queued[1].building = False

    def maybe_maintain(self, tmpl: _Template, entry: _Entry) -> None:
        m = self.manager
        due = time.monotonic() - entry.last_maintained >= m.settings.batch_interval
        conn = self._connection()   # before the lock: a new one may make the manager forget
        if not tmpl.lock.acquire(timeout=LOCK_WAIT):
            return
        try:
            pipeline = entry.pipeline
            if pipeline is None or entry not in tmpl.entries:
                return
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                assert entry.session is not None
                entry.session.apply(conn)
                started = time.perf_counter()
                try:
                    if not due and pipeline.pending(conn) < m.settings.batch_size:
                        return
                    refused = names_refused(conn, entry)
                    if refused is not None:
                        log.info("eager maintenance of sketch %s refused: %s",
                                 entry.sketch.id, refused)
                        m.detach(entry)
                        return
                    m._catch_up_and_maintain(conn, entry, pipeline)  # as a query does
                except ENGINE_BUGS as exc:
                    m._engine_bug(entry, exc)
                    return
                except (IvmError, deltas.DeltaError) as exc:
                    # VersionAhead cannot happen (this snapshot is newer); anything else
                    # leaves the sketch to the next query, which recaptures
                    log.info("eager maintenance of sketch %s failed: %s", entry.sketch.id, exc)
                    m.detach(entry)
                    return
                m._note_maintenance(entry, time.perf_counter() - started)
                entry.last_maintained = time.monotonic()
                m._count("eager_maintenances")
        finally:
            tmpl.lock.release()

    def persist_and_collect(self) -> None:
        """Saves every changed state, then collects audit rows covered by every live state."""
        self._last_state = time.monotonic()
        m = self.manager
        conn = self._connection()
        # first: an evicted sketch's state no longer holds back this round's collection
        evict = getattr(m, "evict_idle", None)
        if evict is not None:
            evict()
        unpersist = getattr(m, "unpersist_evicted", None)
        if unpersist is not None:
            unpersist(conn)
        if not incremental.installed(conn):
            return
        # the horizon first: a state built in a snapshot whose transaction ends before it is
        # read is already held by an entry (collected next) or persisted (seen by the GC)
        low = incremental.horizon(conn)
        prune = getattr(m, "prune_own_xids", None)
        if prune is not None:   # autocommit: no serialisation failure with another proxy's
            prune(conn, low)
        live: dict[int, list[str]] = {}
        for tmpl, entry in m.entries():
            pending = None
            due = time.monotonic() - entry.saved_at >= SAVE_BACKOFF * entry.save_seconds
            started = time.perf_counter()
            with collector.paused():   # the state's snapshot is freed before it ends
                with tmpl.lock:
                    pipeline = entry.pipeline
                    if pipeline is None or pipeline.version is None or pipeline.broken:
                        continue
                    if not m.kept_by_engine(entry):   # e.g. IMP SET strategy = recapture
                        m.give_up_state(entry)
                        continue
                    if entry.dirty and m.settings.persist and due:
                        if m.worth_saving(conn, entry):
                            pending = m.state_to_save(entry)
                        else:  # checked once per move of its version, not every round
                            entry.dirty = False
                    for rel in pipeline.relids:
                        live.setdefault(rel, []).append(pipeline.version)
                if pending is not None:   # written with the template's queries going on
                    with conn.transaction():
                        m.write_state(conn, *pending)
                    pending = None
                    entry.save_seconds = time.perf_counter() - started
                    entry.saved_at = time.monotonic()
        m.delete_given_up(conn)
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            deleted = incremental.collect_garbage(conn, live, low)
        if deleted:
            m._count("gc_rows", deleted)
