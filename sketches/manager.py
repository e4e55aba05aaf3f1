"""``SketchManager``: the facade the proxy calls (docs/INTERFACES.md §1).

``classify(sql)`` is cheap and cached by exact text (LRU): parse, analyse without the
catalog, safety check. ``prepare(conn, sql, params)`` runs inside the client's snapshot on a
service connection: it finds a reusable sketch of the query's template and brings it up to
date through the maintenance hook, or captures a new one, and returns the instrumented SQL.

Maintenance (issue 4, docs/MAINTENANCE.md): by default a sketch is maintained incrementally
(``SketchSettings.strategy``: ``lazy`` — brought to the query's snapshot when a query needs
it — or ``eager`` — also maintained in batches by a background thread, :mod:`sketches.background`).
``recapture`` (and queries the engine cannot maintain) keep ``RecaptureOnChange``: a sketch is
kept only while ``sketches.freshness`` proves that nothing changed since its version.

Capture with incremental state. State may only be built in a snapshot that sees the tables'
tracking (``imp.track_table``) committed: then every write the snapshot does not see fired the
audit triggers, so the deltas since the state's version are complete. ``prepare`` runs in the
client's imported snapshot, which can never see a tracking committed after it was taken, so:
when a query's tables are already tracked in its snapshot, the state is built right there (the
capture); otherwise the sketch is captured plainly for this query (exact in its snapshot, kept
with ``RecaptureOnChange``), the tables are queued for tracking, which the background thread
does in its own short transaction, and the first later query whose snapshot sees the tracking
builds the state (a second capture). Use: ``Pipeline.maintain`` in the query's snapshot, under
the template lock (the background thread takes it too), so versions only move forward; a
snapshot older than the state's version (the background ran ahead) passes through.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import threading
import time
import weakref
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, ClassVar

import psycopg

from sketches import catalog, deltas, freshness, incremental, lookup
from sketches.answers import Answer, Answers, Key, answer_key, query_key, template_state
from sketches.backends.base import BackendError, ExecutionBackend
from sketches.backends.postgres import PostgresBackend
from sketches.capture import CaptureTarget
from sketches.errors import (
    CaptureError,
    CatalogBusy,
    Interrupted,
    PartitionError,
    SelfWritten,
    SketchError,
    TemplateBusy,
    UnsupportedQuery,
)
from sketches.instrument import instrument
from sketches.ivm import state as ivm_state
from sketches.ivm.errors import NotMaintainable
from sketches.ivm.pipeline import Pipeline
from sketches.ivm.plan import SketchTarget
from sketches.lru import Lru
from sketches.maintained import RECENT_CAPTURES_KEPT, IncrementalMaintenance
from sketches.maintained import Entry as _Entry
from sketches.maintained import Template as _Template
from sketches.maintenance import MaintenanceRequest, MaintenanceStrategy, RecaptureOnChange
from sketches.ranges import (
    RangePartition,
    build_partition,
    check_partitionable,
    column_info,
    lock_query_tables,
)
from sketches.safety import (
    SafeAttribute,
    Safety,
    check,
    equivalence_classes,
    errors_kept,
    exact_equalities,
)
from sketches.sketch import Sketch, SketchPart
from sketches.sql import QueryAnalysis, TableRef, analyse, fingerprint
from sketches.sql.grammar import reads_the_clock
from sketches.sql.rewrite import Schemas
from sketches.sql.template import TemplateInstance, instance, reusable
from sketches.worth import compare as compare_plans

log = logging.getLogger(__name__)

INSTALL_LOCK_WAIT = "50ms"
"""How long an install in a query's prepare, or a deferred one, waits for a lock
(:meth:`SketchManager._install`, :meth:`SketchManager.install_deferred`)."""
INSTALL_RETRY_FIRST, INSTALL_RETRY_MAX = 1.0, 60.0
"""Seconds between a deferred install's failed attempt and the next: the first wait, and
the most it grows to by doubling."""

_BACKSLASHES = ("standard_conforming_strings is off: a backslash in a literal is an escape, "
                "which the parser (pglast) and the instrumented text do not have")
"""Why such a session passes through: pglast reads ``'a\\\\b'`` as two backslashes and
prints the range bounds with standard strings, which PostgreSQL then reads with escapes
(found: 0 rows instead of 1000 behind a service connection that had it off too)."""

_SETUP_SQL = ("SELECT {}, pg_catalog.pg_current_snapshot()::pg_catalog.text, "
              "pg_catalog.current_setting('transaction_isolation'), "
              "pg_catalog.pg_current_xact_id_if_assigned()::pg_catalog.text::pg_catalog.int8, "
              + lookup.SERVER_INSTANCE)


MAX_FRAGMENTS = 100_000
"""At most this many fragments per range partition (``SketchSettings.fragments``). Why a
bound: PostgreSQL's statistics give at most 10,001 bounds anyway, and a table without them
gets one exact quantile per fragment, computed from a list of as many fractions (found: an
``IMP SET fragments`` of 10^22 was taken, and that list could never be built)."""


@dataclass(frozen=True, slots=True)
class SketchSettings:
    """``fragments``: fragments per range partition; ``capture_after``: capture on the N-th
    execution of a template (1 = first sight); ``max_coverage``: do not instrument when a
    sketch covers more than this fraction of its fragments (1.0: only when it covers all);
    ``compare_cost``: do not instrument where PostgreSQL plans the instrumented query far
    costlier than the original, or JIT-compiles it where not the original
    (:mod:`sketches.worth`; off: wherever the sketch skips a fragment);
    ``persist``: store partitions and sketches in schema ``imp``; ``strategy``: how new and
    loaded sketches are kept up to date (``lazy`` | ``eager`` | ``recapture``, see
    docs/MAINTENANCE.md); ``batch_size`` / ``batch_interval`` (s): the eager trigger policies
    (maintain once that many delta rows are pending, or that long after the last maintenance);
    ``state_interval`` (s): how often the background thread persists states and collects
    audit rows; ``verify_state``: check a freshly built state's sketch against a capture in
    the same snapshot (one extra capture per state build, not for a shared state; a mismatch
    means an engine bug and the sketch keeps recapture); ``own_sketch_after``: on the N-th
    execution of the same parameter values (thresholds, LIMIT) served only by a sketch of a
    looser instance of the template, capture a sketch of their own (0: always reuse the
    looser sketch), while the template has fewer than ``max_sketches_per_template`` sketches
    and the looser sketch selects more than ``own_sketch_min_coverage`` of a table's
    fragments (below, the rows a tighter sketch would skip on top cost less than maintaining
    one more sketch); ``sketches_kept_per_template``: a capture beyond it — one no sketch of
    the template may serve, such as a new WHERE constant — first evicts the template's least
    recently used sketch (:meth:`SketchManager._make_room`; more than the own-sketch limit, so
    a template used with a few dozen values in turn does not capture at every query);
    ``idle_evict_after`` (s): the background thread evicts a sketch no query used for that
    long (0: never), so a sketch nobody queries holds back no audit-row garbage collection
    (:meth:`SketchManager.evict_idle`);
    ``share_state``: a new sketch of a template whose query differs from an incrementally
    maintained sketch's only in HAVING, or only in the k of a top-k over groups, shares that
    sketch's aggregate state (one maintenance per delta for both, no state build);
    ``max_state_rows``: a sketch whose state build reads more rows than this in one query
    (groups × fragments, say) is kept by recapture instead (a state costs about 0.9 KiB of
    the proxy's memory per group); ``unreused_captures``: when that many of a template's
    latest captures were each never used again (its constants change from query to query),
    a query no sketch may serve passes through on its first execution and is captured on
    its second — a capture costs several times the query itself (0: capture at first sight
    always; at most ``RECENT_CAPTURES_KEPT``); ``template_wait`` (s): a prepare waits at
    most this long for another thread's work on its template (a capture, a maintenance, the
    eager background's) and then passes its query through (0: no limit). Why: a stalled
    maintenance connection, or a huge delta, held every query of the template for as long
    (found by a helper's search of background races: 7–14 s, as long as the test held the
    background's statement), where PostgreSQL answers at once."""

    enabled: bool = True
    fragments: int = 1000
    capture_after: int = 1
    own_sketch_after: int = 2
    max_sketches_per_template: int = 8
    sketches_kept_per_template: int = 64
    own_sketch_min_coverage: float = 0.02
    max_coverage: float = 1.0
    compare_cost: bool = True
    classify_cache_size: int = 4096
    persist: bool = True
    strategy: str = "lazy"
    verify_state: bool = True
    batch_size: int = 1000
    batch_interval: float = 5.0
    state_interval: float = 10.0
    share_state: bool = True
    idle_evict_after: float = 600.0
    max_state_rows: int = 1_000_000
    unreused_captures: int = 4
    template_wait: float = 2.0

    def __post_init__(self) -> None:
        # as IMP SET takes it: "Lazy" from a configuration file was kept as written, and
        # matched neither "lazy" nor "eager" (maintenance off, every write a recapture)
        object.__setattr__(self, "strategy", incremental.check_strategy(self.strategy))
        if not 1 <= self.fragments <= MAX_FRAGMENTS:
            raise ValueError(f"fragments must be in [1, {MAX_FRAGMENTS}]")
        # NaN or infinite intervals stopped the background's rounds (no state saved, no
        # audit row collected, no sketch evicted); "not 0 < x < inf" refuses NaN too
        if self.batch_size < 1 or not 0 < self.batch_interval < math.inf \
                or not 0 < self.state_interval < math.inf:
            raise ValueError("batch_size must be >= 1, batch_interval and state_interval"
                             " finite and > 0")
        if self.own_sketch_after < 0 or self.max_sketches_per_template < 1 \
                or self.sketches_kept_per_template < 1 \
                or not 0 <= self.own_sketch_min_coverage <= 1:
            raise ValueError("own_sketch_after must be >= 0, max_sketches_per_template and "
                             "sketches_kept_per_template >= 1, "
                             "own_sketch_min_coverage in [0, 1]")
        if not self.idle_evict_after >= 0:   # also NaN
            raise ValueError("idle_evict_after must be >= 0 (0: never)")
        if self.max_state_rows < 1:
            raise ValueError("max_state_rows must be >= 1")
        if not 0 <= self.unreused_captures <= RECENT_CAPTURES_KEPT:
            raise ValueError(f"unreused_captures must be in [0, {RECENT_CAPTURES_KEPT}]")


UNREUSED = ("the template's last {n} sketches were never used again (its constants change"
            " from query to query): a query is captured at its second execution")
"""Why a query no sketch may serve is not captured (``SketchSettings.unreused_captures``)."""

COSTLIER = ("its filter makes the plan far costlier than the query's, or JIT-compiled:"
            " original forwarded")
"""Why a sketch that skips fragments is not used (:mod:`sketches.worth`)."""


@dataclass(frozen=True, slots=True)
class Classification:
    candidate: bool
    reason: str
    template: str | None
    tables: tuple[tuple[str | None, str], ...] = ()
    """The relations the query names, (schema as written or None, name): the proxy locks
    them on the client's backend before it takes the query's snapshot."""


@dataclass(slots=True)
class _Uncommitted:
    """What this thread's current transaction wrote to the catalog and the manager cached:
    undone by :meth:`SketchManager.rolled_back` when the transaction does not commit, so a
    cache never points at catalog rows (or a schema) a rollback took away."""

    installed: bool = False
    claimed: bool = False
    partitions: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    captured: list[tuple[_Template, _Entry]] = dataclasses.field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Prepared:
    decision: str  # "use" | "capture" | "passthrough"
    reason: str
    sketch_id: int | None
    instrumented_sql: str | None


class SketchManager(IncrementalMaintenance):
    """Thread-safe facade; one lock per template plus one for shared maps. Incremental
    maintenance: :class:`sketches.maintained.IncrementalMaintenance`."""

    PER_DATABASE: ClassVar[bool] = True
    """Its templates, sketches, partitions and catalog belong to one database: a server that
    serves several keeps one manager per database, however it was named."""

    def __init__(self, settings: SketchSettings | None = None,
                 maintenance: MaintenanceStrategy | None = None,
                 backend: ExecutionBackend | None = None) -> None:
        self.settings = settings or SketchSettings()
        self.backend: ExecutionBackend = backend or PostgresBackend()
        """Where captures and aggregate-state builds run (``sketches.backends``: PostgreSQL,
        or ``routing.RoutedBackend`` choosing PostgreSQL or Spark per job)."""
        self.maintenance: MaintenanceStrategy = maintenance or RecaptureOnChange()
        self._custom = maintenance is not None  # a hook given by the caller decides alone
        self._conninfo: dict[str, Any] | None = None
        self._to_track: dict[str, incremental.SessionSettings] = {}
        self._to_build: list[tuple[_Template, _Entry, Pipeline]] = []
        self._unsaved: set[int] = set()
        self._background: Any = None  # sketches.background.Background, started on demand
        self._seconds: defaultdict[str, float] = defaultdict(float)
        self._lock = threading.Lock()
        size = self.settings.classify_cache_size
        self._classified: Lru[str, Classification] = Lru(size)
        self._analysed: Lru[tuple[str, str],
                            tuple[QueryAnalysis, Safety, tuple[str, ...] | None]] = Lru(size)
        self._templates: OrderedDict[str, _Template] = OrderedDict()   # least recent first
        self._instances: Lru[tuple[object, ...], TemplateInstance] = Lru(size)
        self._role_checked: Lru[tuple[str, str], tuple[str, lookup.Relations]] = Lru(size)
        # key -> (partition, nullable, thread whose transaction saved it and has not yet
        # committed, or None)
        self._partitions: dict[tuple[str, str, str],
                               tuple[RangePartition, bool, int | None]] = {}
        self._own_xids: set[int] = set()
        self._installed = False
        self._installing: int | None = None   # thread whose transaction installs schema imp
        self._install_deferred = False   # left to the background thread (_install)
        self._install_backoff = INSTALL_RETRY_FIRST / 2   # doubled before each wait
        self._install_retry_at = 0.0
        self._clock = time.monotonic
        self._claimed = False   # imp.claim_identity() ran (catalog.claim_identity)
        self._started: str | None = None   # start time and database: see server_started
        self._txn = threading.local()
        self._stats: Counter[str] = Counter()
        self._answers = Answers(self.settings.classify_cache_size)
        self._verdicts: Lru[tuple[object, ...], bool] = Lru(self.settings.classify_cache_size)
        self._evicted: dict[int, float] = {}
        """Ids of sketches evicted from memory whose catalog rows the background thread has
        yet to invalidate (:meth:`unpersist_evicted`), with when they were queued."""
        self._other_settings: dict[int, float] = {}
        """Ids of the catalog's sketches captured under other settings (never loaded here),
        with when a load first left them out: :meth:`evict_idle` invalidates them after
        ``idle_evict_after`` (found by a regression search in session 25: after a restart
        under another TimeZone, the old sketches' states held back the audit-row garbage
        collection for ever)."""

    # ---- classification --------------------------------------------------------------

    def classify(self, sql: str) -> Classification:
        """Cheap verdict by exact text: supported class and a safe attribute?"""
        with self._lock:
            hit = self._classified.get(sql)
            if hit is not None:
                self._stats["classify_hits"] += 1
                return hit
        result = self._classify(sql)
        with self._lock:
            self._stats["classify_misses"] += 1
            self._classified.put(sql, result)
        return result

    @staticmethod
    def _classify(sql: str) -> Classification:
        try:
            template = fingerprint(sql)
        except UnsupportedQuery as exc:
            return Classification(False, str(exc), None)
        try:
            analysis = analyse(sql, lenient=True)
        except UnsupportedQuery as exc:
            return Classification(False, str(exc), template)
        tables = tuple((t.schema, t.name) for t in analysis.tables)
        if not analysis.resolved:
            # Supported syntax; which attributes are safe depends on the catalog.
            return Classification(True, "columns resolved against the catalog at prepare",
                                  template, tables)
        safety = check(analysis)
        return Classification(safety.sketchable, safety.reason, template, tables)

    # ---- prepare ---------------------------------------------------------------------

    handles_other_settings = True
    """:meth:`prepare` takes ``settings_differ`` (the proxy asks it for sessions whose
    TimeZone, DateStyle or IntervalStyle differ from the service connection's)."""

    checks_role = True
    """:meth:`prepare` takes ``role``: the client's ``current_user`` (the proxy reads it in
    its snapshot round trip)."""

    explains = True
    """:meth:`prepare` takes ``explain`` (the proxy's ``IMP EXPLAIN``)."""

    def prepare(self, conn: psycopg.Connection[Any], sql: str,
                params: Sequence[object] | None = None,
                search_path: str | None = None, snapshot: str | None = None,
                settings_differ: str | None = None,
                stop: threading.Event | None = None, role: str | None = None,
                explain: bool = False) -> Prepared:
        """Captures or uses a sketch for ``sql`` in ``conn``'s snapshot (see INTERFACES §1).

        ``snapshot`` (with ``search_path``): the caller vouches that conn is in a fresh
        REPEATABLE READ transaction with this ``pg_current_snapshot()`` and this search_path
        already set (the proxy: the client's, imported), which saves the round trip that
        would read them. Refusals (unsupported, not sketchable, safety belt) return a
        passthrough; database errors propagate (the caller rolls back and forwards the
        original query).

        ``settings_differ``: why the client session's TimeZone, DateStyle or IntervalStyle
        are not conn's. Then only a query that means the same under both is served: one that
        reads no date, time, interval, range or composite value (``Relations.settings_free``)
        and has no such parameter; any other passes through with this reason.

        ``stop``: once set, a prepare still waiting for another one of its template (a
        capture, a maintenance: the template's lock) raises :class:`Interrupted`. Why: the
        caller's client cancelled, and that wait is in Python, where no cancel of the
        database reaches it.

        ``role``: the role the caller's client runs the query as (its ``current_user``; None:
        conn's own role, which needs no check). Before the manager does anything on conn's
        role's authority — installing its catalog, a capture (statistics targets, ANALYZE,
        tables queued for tracking, a stored sketch) — ``role`` must have SELECT on every
        table of the query (``has_table_privilege``), else the query passes through and
        PostgreSQL refuses it to the client itself. A role with column privileges only
        passes through too (PostgreSQL answers it, exactly). Why only there: a use needs no
        check — the instrumented query runs as the client, so PostgreSQL checks it — and the
        check costs a round trip the common use path must not pay.

        ``explain``: the decision is only shown (``IMP EXPLAIN``), the query not run: it is
        made as for the query, but a sketch it would use is not counted as used (uses, last
        use, reuse), which would keep an idle sketch from eviction (found by a helper's
        search)."""
        if not self.settings.enabled:
            return self._passthrough("sketches disabled")
        if conn.info.parameter_status("standard_conforming_strings") != "on":
            return self._passthrough(_BACKSLASHES)
        cls = self.classify(sql)
        if not cls.candidate or cls.template is None:
            return self._passthrough(cls.reason)
        wrote = False
        if snapshot is not None and search_path is not None:
            path = search_path
        else:
            path, snapshot, wrote = self._setup(conn, search_path)
        if self._conninfo is None:
            self._remember_conninfo(conn)
        try:
            return self._prepare_locked(conn, sql, params, search_path, path, snapshot,
                                        cls.template, settings_differ, stop, role, wrote,
                                        explain)
        except BaseException as exc:
            if isinstance(exc, psycopg.Error):
                # read from the catalog again next time: another thread's partition this
                # snapshot cannot see, or a column whose type changed under the cached one
                # (found: width_bucket(text, integer[]) failed every query until a restart)
                with self._lock:
                    self._partitions.clear()
                if _catalog_gone(exc) and not _partition_unseen(exc):
                    self._catalog_lost(exc)
            self.rolled_back()
            raise

    def _prepare_locked(self, conn: psycopg.Connection[Any], sql: str,
                        params: Sequence[object] | None, search_path: str | None, path: str,
                        snapshot: str | None, template: str,
                        settings_differ: str | None = None,
                        stop: threading.Event | None = None,
                        role: str | None = None, wrote: bool = False,
                        explain: bool = False) -> Prepared:
        self._txn.uncommitted = _Uncommitted()
        try:
            with self._held_template(template, stop, self.settings.template_wait) as tmpl:
                tmpl.seen += 1
                key = (answer_key(sql, params, search_path) if search_path is not None
                       else None)
                return self._prepare(conn, sql, tuple(params) if params is not None else None,
                                     template, tmpl, path, snapshot, key, settings_differ,
                                     role, wrote, explain)
        except CaptureError:
            self._stats["errors"] += 1
            raise
        except Interrupted:
            raise
        except SketchError as exc:   # TemplateBusy too: no decision, the query passes through
            return self._passthrough(str(exc))

    def rolled_back(self) -> None:
        """The transaction of this thread's last :meth:`prepare` did not commit (it raised,
        or the caller's COMMIT failed): forget what the manager cached from its catalog
        writes — the installed schema, partitions saved and sketches captured in it — so the
        next prepare reads or writes them again instead of failing on rows that are gone."""
        undo: _Uncommitted | None = getattr(self._txn, "uncommitted", None)
        self._txn.uncommitted = None
        if undo is None:
            return
        with self._lock:
            if undo.installed:
                self._installed = False
                if self._installing == threading.get_ident():
                    self._installing = None
            if undo.claimed:   # a discard of foreign state rolled back with it
                self._claimed = False
            for key in undo.partitions:
                self._partitions.pop(key, None)
        for tmpl, entry in undo.captured:  # exact in memory, but its catalog row is gone
            with tmpl.lock:
                if entry in tmpl.entries:
                    tmpl.entries.remove(entry)
                    self.detach(entry)

    def _catalog_lost(self, exc: psycopg.Error) -> None:
        """Schema ``imp`` (or rows the manager cached from it) went away under a running
        manager — ``DROP SCHEMA imp CASCADE``, a restore of an older dump: forget everything
        taken from it, the sketches held included (their audit trail may have a gap), so the
        next prepare installs the catalog again and captures afresh instead of failing on
        every query."""
        log.warning("the sketch catalog no longer matches what the manager holds (%s): "
                    "forgetting its sketches and partitions", exc.diag.message_primary)
        with self._lock:
            self._installed = False
            self._installing = None
            self._claimed = False   # perhaps restored from another database: judge it again
            self._partitions.clear()
            self._evicted.clear()   # a new catalog's ids start again: never invalidate those
        self._count("catalog_lost")
        self._drop_in_memory(loaded=False)

    def _uncommitted(self) -> _Uncommitted:
        undo: _Uncommitted | None = getattr(self._txn, "uncommitted", None)
        if undo is None:
            undo = self._txn.uncommitted = _Uncommitted()
        return undo

    def _setup(self, conn: psycopg.Connection[Any],
               search_path: str | None) -> tuple[str, str | None, bool]:
        """One round trip: the search_path in force (the analysis cache's key), inside a
        REPEATABLE READ / SERIALIZABLE transaction that wrote nothing, its snapshot (a sketch
        whose state is at exactly this snapshot needs no maintenance; a transaction with an
        xid sees its own writes, which no snapshot shows), and whether the transaction has
        written already (it has an xid): outside the contract of :meth:`prepare` (a fresh
        transaction), whose queries then pass through. Why also after the manager's own
        writes in an earlier prepare of the same transaction: the caller's writes after them
        carry the same xid, which the manager records as its own (found by a regression
        search in session 28: a group inserted after a capture left out)."""
        if search_path is not None:
            row = conn.execute(_SETUP_SQL.format(
                "set_config('search_path', %s, true)"), (search_path,)).fetchone()
        else:
            row = conn.execute(_SETUP_SQL.format(lookup.EFFECTIVE_SEARCH_PATH)).fetchone()
        assert row is not None
        self.server_started(str(row[4]))
        snapshot = str(row[1]) if row[2] in ("repeatable read", "serializable") \
            and row[3] is None \
            and conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS else None
        return str(row[0]), snapshot, row[3] is not None

    def server_started(self, started: str) -> None:
        """PostgreSQL's start time and the database's oid (:data:`lookup.SERVER_INSTANCE`) as
        last seen. A change of the first means it restarted under the running manager,
        perhaps after a crash, which empties unlogged tables and can lose transactions the
        manager saw committed (``synchronous_commit = off``), whose xids PostgreSQL then hands
        out again: states and answers kept in memory would count rows that are gone, and a
        later snapshot could read as one they were taken in (found: after a crash and new
        inserts, 0 rows instead of 1). A change of the second means the database's name now
        names another database (dropped and made anew from a copy, renamed), whose tables
        may have the same oids and epochs. Either way they are forgotten; the catalog's are
        judged again (``claim_identity`` discards a copied database's) and read again."""
        if started == self._started:   # every query of the proxy's: no lock when unchanged
            return
        with self._lock:
            previous, self._started = self._started, started
        if previous is None or previous == started:
            return
        log.warning("PostgreSQL restarted or the database was replaced (now %s, before %s):"
                    " forgetting the sketches, states and answers held in memory",
                    started, previous)
        restarted = previous.partition("/")[0] != started.partition("/")[0]
        self._count("server_restarts" if restarted else "databases_replaced")
        self._forget_held(judge_catalog_again=True)

    def _forget_held(self, judge_catalog_again: bool) -> None:
        """Forgets every sketch, state, answer, partition, role check and own transaction
        held in memory (the catalog's are read again): after a restart of PostgreSQL, or once
        the catalog's state was discarded as another database's. ``judge_catalog_again``: the
        catalog is checked (installed, claimed) anew too, in the same critical section."""
        with self._lock:
            if judge_catalog_again:
                self._installed = False
                self._installing = None
                self._claimed = False
            self._partitions.clear()
            self._role_checked.clear()
            self._own_xids.clear()
        self._answers.clear()
        self._drop_in_memory(loaded=False)

    def prepare_cached(self, sql: str, params: Sequence[object] | None, search_path: str,
                       snapshot: str, settings_differ: bool = False) -> Prepared | None:
        """:meth:`prepare`'s answer for a query run in ``snapshot`` (``pg_current_snapshot()``
        text) with ``search_path``, when an earlier call in that same snapshot answered it
        with a sketch needing nothing from the database (``sketches.answers``); None: call
        :meth:`prepare`. Never blocks (a template busy elsewhere is a None) and touches no
        database, so it may run on the proxy's event loop. ``settings_differ``: the session's
        TimeZone, DateStyle or IntervalStyle are not the service connection's (only an answer
        for a query that reads no date, time or interval serves it)."""
        key = answer_key(sql, params, search_path)
        answer = None if key is None or not self.settings.enabled else self._answers.get(key)
        if answer is None or (settings_differ and not answer.settings_free):
            return None
        tmpl = answer.template
        if not tmpl.lock.acquire(blocking=False):
            return None
        try:
            entry = answer.holds(snapshot, self.strategy_of)
            if entry is None or (self._useful(entry.sketch) and sql not in entry.instrumented):
                return None
            tmpl.seen += 1
            tmpl.note_values(answer.values)
            tmpl.note_query(query_key(sql, params))
            self._note_use(entry)
            self._count("answered_in_memory")
            return self._finish("use", sql, entry)
        finally:
            tmpl.lock.release()

    def decline_unpaid(self, sql: str, params: Sequence[object] | None) -> Prepared | None:
        """:meth:`prepare`'s passthrough for a query whose capture would go unused
        (:meth:`_unpaid`) and that no sketch of its template may serve, decided without a
        database (None: call :meth:`prepare`); the proxy asks it in its worker thread before
        it takes a service connection. Why: the service connection's transaction cost a
        declined query about 2 ms more (session 30). Not on the event loop: the check
        against every kept sketch of a template took up to 0.5 s for long texts (a helper's
        search, session 30)."""
        n = self.settings.unreused_captures
        if not n or not self.settings.enabled:
            return None
        try:
            template = fingerprint(sql)   # a template with captures was a candidate
        except UnsupportedQuery:
            return None
        with self._lock:
            tmpl = self._templates.get(template)
        if tmpl is None or not tmpl.lock.acquire(blocking=False):
            return None
        try:
            qkey = query_key(sql, params)
            if qkey is None or tmpl.ran(qkey) or not tmpl.unreused(n):
                return None
            declined = self._decline_unserved(tmpl, sql,
                                              None if params is None else tuple(params))
            if declined is not None:
                tmpl.seen += 1
                tmpl.note_query(qkey)
            return declined
        finally:
            tmpl.lock.release()

    def _decline_unserved(self, tmpl: _Template, sql: str,
                          params: tuple[object, ...] | None) -> Prepared | None:
        """:meth:`_decline_capture` when no sketch of ``tmpl`` may serve the query, whatever
        its tables (the caller holds the template lock and found the capture
        :meth:`_unpaid`), counting the query's values; None otherwise, also when the text
        has no instance (the long way reports why)."""
        try:
            inst = self._instance(sql, params)
        except SketchError:
            return None
        if any(self._reusable(e, inst) for e in tmpl.entries):
            return None
        tmpl.note_values(_values(inst))
        return self._decline_capture()

    def _note_use(self, entry: _Entry) -> None:
        entry.uses += 1
        entry.reuse.used = True
        entry.last_used = time.time()
        self._count("uses")

    def _remember(self, key: Key | None, snapshot: str | None, tmpl: _Template,
                  entry: _Entry, inst: TemplateInstance, settings_free: bool) -> None:
        """Keeps a "use" answer for :meth:`prepare_cached` (the caller holds the template
        lock): only of a sketch for the query's own values, maintained by the engine;
        ``settings_free``: it may also answer sessions with other TimeZone, DateStyle and
        IntervalStyle."""
        if key is None or snapshot is None or self._custom \
                or not _same_values(entry.instance, inst):
            return
        strategy = self.strategy_of(entry)
        answer = Answer(snapshot, tmpl, weakref.ref(entry), template_state(tmpl), strategy,
                        _values(inst), settings_free)
        if strategy in ("lazy", "eager") and answer.holds(snapshot, self.strategy_of):
            self._answers.remember(key, answer)

    def _passthrough(self, reason: str) -> Prepared:
        with self._lock:
            self._stats["passthrough"] += 1
        return Prepared("passthrough", reason, None, None)

    @contextlib.contextmanager
    def _held_template(self, template: str, stop: threading.Event | None,
                       wait: float = 0.0) -> Iterator[_Template]:
        """The template's state, its lock held inside; one :meth:`_trim_templates` dropped
        while this thread waited for its lock is made anew. ``wait`` > 0: at most that many
        seconds in all (then :class:`TemplateBusy`)."""
        deadline = time.monotonic() + wait if wait > 0 else None
        while True:
            with self._lock:
                tmpl = self._templates.get(template)
                if tmpl is None:
                    tmpl = self._templates[template] = _Template()
                    self._trim_templates(keep=template)
                else:
                    self._templates.move_to_end(template)
            with _held(tmpl.lock, stop, deadline):
                if self._templates.get(template) is tmpl:
                    yield tmpl
                    return

    def _trim_templates(self, keep: str) -> None:
        """Drops the least recently used templates that hold no sketch and no thread holds,
        beyond ``classify_cache_size`` (under ``self._lock``), never ``keep`` (the one just
        made). Why: a template was kept for
        every query shape ever classified a candidate, also one that then failed or passed
        through (found by a helper's search of resource bounds in session 26: 0.6 KiB more
        per distinct shape, for ever). What a dropped one knew is its execution count, read
        again from zero, and that its catalog sketches were loaded."""
        excess = len(self._templates) - self.settings.classify_cache_size
        if excess <= 0:
            return
        for key in list(itertools.islice(self._templates, 4 * excess + 16)):
            tmpl = self._templates[key]
            if key != keep and not tmpl.entries and not tmpl.lock.locked():
                del self._templates[key]
                excess -= 1
                if excess <= 0:
                    return

    def _prepare(self, conn: psycopg.Connection[Any], sql: str,
                 params: tuple[object, ...] | None, template: str,
                 tmpl: _Template, search_path: str | None = None,
                 snapshot: str | None = None, key: Key | None = None,
                 settings_differ: str | None = None, role: str | None = None,
                 wrote: bool = False, explain: bool = False) -> Prepared:
        if wrote:   # found by a helper's search in session 28: a group it inserted left out
            return self._passthrough("the transaction has written: its own writes are visible"
                                     " to it but in no snapshot")
        repeated = tmpl.note_query(query_key(sql, params)) > 1
        if self._unpaid(tmpl, repeated):
            declined = self._decline_unserved(tmpl, sql, params)
            if declined is not None:
                return declined
        if search_path is None:
            search_path = _search_path(conn)
        analysis, safety, columns = self._analyse(conn, sql, search_path, snapshot)
        if columns is None:   # the text alone makes it unsketchable
            return self._passthrough(safety.reason)
        relations = self._relations(conn, analysis, search_path, snapshot)
        if relations.reason is None and relations.columns != columns:   # analysed on others
            analysis, safety, _c = self._analyse(conn, sql, search_path, snapshot, again=True)
            relations = self._relations(conn, analysis, search_path, snapshot)
        if not safety.sketchable:
            return self._passthrough(safety.reason)
        if _clock_values(params):
            return self._passthrough("a parameter reads the clock ('now', 'today', …)")
        if relations.reason is not None:
            return self._passthrough(relations.reason)
        free = (relations.settings_free and not analysis.calls & TEMPORAL_FUNCTIONS
                and _settings_free_values(params))
        if settings_differ is not None and not free:
            return self._passthrough(settings_differ)
        checked = role is None   # see prepare(): checked before the first write only
        if self.settings.persist:
            if not self._installed:
                denied = _may_not_read(conn, role, relations.oids)
                if denied is not None:
                    return self._passthrough(denied)
                checked = True
            self._ensure_catalog(conn)
            if not tmpl.loaded and relations.oids not in tmpl.loaded_on:
                self._load(conn, template, tmpl, relations)
        else:   # no catalog of ours, but tracked tables and audit tables may be restored ones
            self._claim_or_defer(conn)
        inst = self._instance(sql, params)
        request = MaintenanceRequest(analysis, params, frozenset(self._own_xids))
        runs = tmpl.note_values(_values(inst))
        carried: str | None = None   # the per-sketch strategy of a sketch captured anew
        schemas = _schemas(analysis, relations.names)
        for entry in self._candidates(tmpl, inst, relations.oids):
            if not _same_values(entry.instance, inst):
                if not self._useful(entry.sketch):
                    continue  # a broad sketch of a looser query: a fresh capture may skip more
                if self._wants_own(tmpl, entry, runs):
                    break
            if not _pin_schemas(entry, schemas):
                self._forget(tmpl, entry)
                continue
            refreshed = self._refresh(conn, entry, request, snapshot, tmpl)
            if isinstance(refreshed, str):
                return self._passthrough(refreshed)
            if refreshed is None:
                if _same_values(entry.instance, inst):
                    carried = carried or entry.strategy
                self._forget(tmpl, entry)
                continue
            if refreshed is not entry.sketch:
                entry.maintenances += 1
                entry.sketch = refreshed
                entry.instrumented.clear()
            if not explain:   # only shown: no use (see prepare)
                self._note_use(entry)
            prepared = self._finish("use", sql, entry, conn, params)
            self._remember(key, snapshot, tmpl, entry, inst, free)
            return prepared
        if not tmpl.entries and tmpl.seen < self.settings.capture_after:
            return self._passthrough(f"template seen {tmpl.seen} of "
                                     f"{self.settings.capture_after} times before capture")
        if self._unpaid(tmpl, repeated):
            return self._decline_capture()
        denied = None if checked else _may_not_read(conn, role, relations.oids)
        if denied is not None:
            return self._passthrough(denied)
        entry = self._capture(conn, sql, params, template, tmpl, analysis, safety,
                              relations.oids, relations.names, carried)
        entry.instance, entry.last_used, entry.uses = inst, time.time(), 1
        entry.strategy = carried   # IMP SET STRATEGY … FOR SKETCH outlives a recapture
        self._make_room(tmpl)
        tmpl.entries.insert(0, entry)
        tmpl.recent.append(entry.reuse)
        self._uncommitted().captured.append((tmpl, entry))
        self._count("captures")
        return self._finish("capture", sql, entry, conn, params)

    def _relations(self, conn: psycopg.Connection[Any], analysis: QueryAnalysis,
                   search_path: str | None, snapshot: str | None) -> lookup.Relations:
        """``lookup.relations``, reused while the snapshot stays the same: the same snapshot
        means no transaction committed in between, so no DDL (row-level security, a table
        replaced by a view, a table created in front on the search_path) either — the
        catalog reads the same."""
        if snapshot is None or search_path is None:
            return lookup.relations(conn, analysis)
        key = (analysis.sql, search_path)
        with self._lock:
            hit = self._role_checked.get(key)
        if hit is not None and hit[0] == snapshot:
            return hit[1]
        found = lookup.relations(conn, analysis)
        with self._lock:
            self._role_checked.put(key, (snapshot, found))
        return found

    def _instance(self, sql: str, params: tuple[object, ...] | None) -> TemplateInstance:
        """``instance(sql, params)``, cached by text and typed parameter values (parsing and
        copying the statement's tree cost milliseconds per query). Instances are immutable."""
        key = query_key(sql, params)
        if key is None:  # an unhashable parameter value: no caching
            return instance(sql, params)
        with self._lock:
            hit = self._instances.get(key)
            if hit is not None:
                return hit
        inst = instance(sql, params)
        with self._lock:
            self._instances.put(key, inst)
        return inst

    def _unpaid(self, tmpl: _Template, repeated: bool) -> bool:
        """Would a capture for a query run the first time (not ``repeated``) go unused, as
        the template's last ``unreused_captures`` did? Then a query no sketch may serve
        passes through (:meth:`_decline_capture`). Decided, where no sketch of the template
        may serve the query whatever its tables, before the query's analysis and catalog
        checks: they cost 12 ms of the 18 a declined prepare took (session 30)."""
        n = self.settings.unreused_captures
        return bool(n) and not repeated and tmpl.unreused(n)

    def _decline_capture(self) -> Prepared:
        self._count("captures_declined")
        return self._passthrough(UNREUSED.format(n=self.settings.unreused_captures))

    def _candidates(self, tmpl: _Template, inst: TemplateInstance,
                    relations: tuple[int, ...]) -> list[_Entry]:
        """The template's sketches that may serve ``inst`` on these ``relations`` (the same
        text names other tables under another search_path), best first: one captured for the
        same values, then the others by the fraction of fragments they select (the fewer,
        the less the instrumented query reads). Why not the newest: a looser instance's
        sketch, captured later, would otherwise serve every stricter one."""
        usable = [e for e in tmpl.entries
                  if e.relations == relations and self._reusable(e, inst)]
        return sorted(usable, key=lambda e: (not _same_values(e.instance, inst),
                                             sum(p.coverage for p in e.sketch.parts)))

    def _make_room(self, tmpl: _Template) -> None:
        """Before a capture joins ``tmpl`` (whose lock the caller holds, so no other thread
        is using one of its sketches): evicts its least recently used sketches until one
        more fits within ``sketches_kept_per_template``. Why: every new WHERE constant of a
        template, or a looser HAVING threshold than every sketch's, is an instance no sketch
        may serve, and each capture was kept for ever — in memory, as a state maintained at
        every write, and in the catalog (found: 301 sketches for 300 queries of one
        template; the cap was checked only before a capture "of its own")."""
        while len(tmpl.entries) >= self.settings.sketches_kept_per_template:
            victim = min(tmpl.entries, key=lambda e: e.idle_since())
            self._evict(tmpl, victim)
            self._count("evicted")
            self._ensure_background()   # it invalidates the victim's catalog row

    def _evict(self, tmpl: _Template, entry: _Entry) -> bool:
        """Forgets ``entry`` as a drop does (the caller holds the template lock): out of the
        template, its pipeline detached (a shared one stops maintaining its head), its
        catalog row and persisted state queued for the background thread to invalidate and
        delete (:meth:`unpersist_evicted`). Why not in the caller's transaction: a prepare's
        runs in the client's snapshot, which cannot see — so cannot invalidate — a sketch
        another thread captured since, and whose rollback would undo the invalidation while
        the sketch stays forgotten: either way a valid row nobody holds in memory, whose
        persisted state held back the audit-row garbage collection for ever."""
        with self._lock:  # drop() and the admin listings read the entries under it
            if entry not in tmpl.entries:
                return False
            tmpl.entries.remove(entry)
        sid = entry.sketch.id
        if self.settings.persist and sid is not None and sid > 0:
            self._queue_unpersist([sid])
        self.detach(entry)
        return True

    def _queue_unpersist(self, sketch_ids: Sequence[int]) -> None:
        """Queues sketches for :meth:`unpersist_evicted` (the background thread's)."""
        now = time.monotonic()
        with self._lock:
            for sid in sketch_ids:
                self._evicted.setdefault(sid, now)

    def evict_idle(self) -> int:
        """Evicts every sketch no query used for ``idle_evict_after`` seconds (a sketch
        loaded from the catalog and not used since: since it was loaded), for the background
        thread; a template busy elsewhere is skipped (it is looked at again next round).
        Returns how many were evicted. Why: a lazy sketch nobody queries is never maintained,
        so its version never moves, and the garbage collection (the meet of every version
        held) kept every audit row of its tables written since, without limit. A later query
        of it captures anew."""
        after = self.settings.idle_evict_after
        if after <= 0:
            return 0
        cutoff = time.time() - after
        evicted = 0
        for tmpl, entry in self.entries():
            if entry.idle_since() > cutoff or not tmpl.lock.acquire(blocking=False):
                continue
            try:   # checked again under the lock: a query may have used it meanwhile
                if entry.idle_since() <= cutoff and self._evict(tmpl, entry):
                    evicted += 1
            finally:
                tmpl.lock.release()
        if evicted:
            self._count("evicted_idle", evicted)
            log.info("%d sketch(es) unused for %s s evicted", evicted, after)
        with self._lock:
            unloaded = [sid for sid, seen in self._other_settings.items() if seen <= cutoff]
            for sid in unloaded:
                del self._other_settings[sid]
        if unloaded:   # another proxy's may be in use: its watermark check recaptures it
            self._queue_unpersist(unloaded)
            self._count("evicted_other_settings", len(unloaded))
            log.info("%d sketch(es) of other settings unloaded for %s s invalidated",
                     len(unloaded), after)
        return evicted

    def unpersist_evicted(self, conn: psycopg.Connection[Any]) -> int:
        """Invalidates the catalog rows of the evicted sketches and deletes their persisted
        states, in a transaction of its own on ``conn`` (the background thread's, autocommit),
        which sees every committed capture. A row not found yet (its capture has not
        committed) is tried again in later rounds for ``EVICTED_RETRY`` seconds. Returns how
        many rows were invalidated."""
        with self._lock:
            queued, self._evicted = self._evicted, {}
        if not queued:
            return 0
        found: set[int] = set()
        try:
            if catalog.is_installed(conn):
                with conn.transaction():
                    found = catalog.invalidate_many(conn, sorted(queued))
                    if found and incremental.installed(conn):
                        for sid in sorted(found):
                            ivm_state.delete(conn, str(sid))
                    if found:
                        self._remember_own_xid(conn)
            else:   # no catalog (dropped): nothing of theirs is left to invalidate
                queued = {}
        except BaseException:
            with self._lock:   # this round failed: the next one tries again
                for sid, at in queued.items():
                    self._evicted.setdefault(sid, at)
            raise
        now = time.monotonic()
        with self._lock:
            for sid, at in queued.items():
                if sid not in found and now - at < EVICTED_RETRY:
                    self._evicted.setdefault(sid, at)
        return len(found)

    def _wants_own(self, tmpl: _Template, looser: _Entry, runs: int) -> bool:
        """Capture a sketch for values run ``runs`` times rather than reuse ``looser``?"""
        s = self.settings
        return (0 < s.own_sketch_after <= runs
                and len(tmpl.entries) < s.max_sketches_per_template
                and max(p.coverage for p in looser.sketch.parts) > s.own_sketch_min_coverage)

    @staticmethod
    def _reusable(entry: _Entry, inst: TemplateInstance) -> bool:
        """``reusable(entry.instance, inst)``, remembered per entry (the caller holds the
        template lock; both instances are immutable, and ``entry.instance`` never changes)."""
        known = entry.reusable_for.get(id(inst))
        if known is not None and known[0] is inst:
            return known[1]
        verdict = reusable(entry.instance, inst)
        if len(entry.reusable_for) >= 256:
            entry.reusable_for.clear()
        entry.reusable_for[id(inst)] = (inst, verdict)
        return verdict

    def _useful(self, sketch: Sketch) -> bool:
        """Would the sketch be used for instrumentation at all?"""
        return not sketch.covers_all and \
            max(p.coverage for p in sketch.parts) <= self.settings.max_coverage

    def _analyse(self, conn: psycopg.Connection[Any], sql: str, search_path: str,
                 snapshot: str | None = None, again: bool = False
                 ) -> tuple[QueryAnalysis, Safety, tuple[str, ...] | None]:
        """Analysis with the catalog (also the column types rule 5 of
        :mod:`sketches.safety` reads), cached by (text, search_path) unless ``again``, and
        what the query's tables' columns were then (``lookup.Relations.columns``; None for
        a query the text alone makes unsketchable). The caller analyses again when they
        changed since: a cached analysis read the catalog as it was
        (:data:`sketches.lookup._COLUMNS`), and a verdict of rule 5 follows the column types
        both ways (found: a column changed to float8 and back to int left its query passed
        through for good)."""
        key = (sql, search_path)
        if not again:
            with self._lock:
                hit = self._analysed.get(key)
            if hit is not None:
                return hit
        analysis = analyse(sql, lookup.resolver(conn))
        safety = check(analysis)
        columns = None
        if safety.sketchable:
            safety = errors_kept(analysis, safety, lookup.raising_catalog(conn, analysis))
            columns = self._relations(conn, analysis, search_path, snapshot).columns
        result = (analysis, safety, columns)
        with self._lock:
            self._analysed.put(key, result)
        return result

    def _finish(self, decision: str, sql: str, entry: _Entry,
                conn: psycopg.Connection[Any] | None = None,
                params: Sequence[object] | None = None) -> Prepared:
        """The answer for ``sql`` with ``entry``'s sketch. ``conn`` (in the query's snapshot)
        plans a text not instrumented before with this sketch, with ``params``
        (``compare_cost``); without it the text must have been (the answer from memory)."""
        sketch = entry.sketch
        worst = max(p.coverage for p in sketch.parts)
        if sketch.covers_all:
            return Prepared(decision, "sketch covers every fragment", sketch.id, None)
        if worst > self.settings.max_coverage:
            return Prepared(decision, f"sketch covers {worst:.0%} of the fragments",
                            sketch.id, None)
        if sql in entry.instrumented:
            text = entry.instrumented.get(sql)
        else:
            text = instrument(sql, sketch.parts, entry.schemas)
            if text is not None and conn is not None and not self._pays(conn, sql, text,
                                                                        params):
                text = None
            entry.remember_instrumented(sql, text)
        summary = ", ".join(f"{p.table.alias}.{p.column} {len(p.fragments)}/"
                            f"{p.partition.fragment_count}" for p in sketch.parts)
        if text is None:
            return Prepared(decision, f"sketch {summary}: {COSTLIER}", sketch.id, None)
        return Prepared(decision, f"sketch {summary}", sketch.id, text)

    def _pays(self, conn: psycopg.Connection[Any], sql: str, text: str,
              params: Sequence[object] | None) -> bool:
        """May ``text`` (``sql`` instrumented) be run instead of ``sql``: is it not planned far
        costlier, nor JIT-compiled where ``sql`` is not (:func:`sketches.worth.compare`)?
        Remembered per instrumented text and parameters: a maintenance that leaves the
        fragments as they were keeps the text, and is not planned twice again."""
        if not self.settings.compare_cost:
            return True
        qk = query_key(text, params)
        with self._lock:
            known = self._verdicts.get(qk) if qk is not None else None
        if known is not None:
            return known
        verdict = compare_plans(conn, sql, text, params)
        if not verdict.pays:
            self._count("filters_declined")
            log.info("%s: %s", sql[:200], verdict.reason)
        if qk is not None:
            with self._lock:
                self._verdicts.put(qk, verdict.pays)
        return verdict.pays

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._stats[key] += n

    # ---- capture ---------------------------------------------------------------------

    def _capture(self, conn: psycopg.Connection[Any], sql: str,
                 params: tuple[object, ...] | None, template: str, tmpl: _Template,
                 analysis: QueryAnalysis, safety: Safety,
                 relations: tuple[int, ...],
                 names: Sequence[tuple[str, str]] = (), strategy: str | None = None) -> _Entry:
        """A new sketch on ``relations``: with incremental state when the tables are tracked
        in this snapshot (shared with a sketch of ``tmpl`` on the same relations, whose lock
        the caller holds, where possible), else captured plainly (and the tables queued for
        tracking). ``names``: the relations' (schema, name), locked ACCESS SHARE first with
        a bounded wait (:func:`sketches.ranges.lock_query_tables`): a partition built here
        takes SHARE UPDATE EXCLUSIVE on its table, which must not be held while the capture
        waits for another table of the query. ``strategy``: the per-sketch strategy of the
        sketch it replaces (a ``recapture`` one builds no state). Every text made for the
        sketch names the tables in the schemas of ``names`` (:func:`_pin_schemas`)."""
        lock_query_tables(conn, names)
        schemas = _schemas(analysis, names) if names else ()
        analysis = analysis.with_schemas(schemas)
        targets = self._targets(conn, analysis, safety)
        if freshness.user_triggers_ran(conn):
            raise SelfWritten("the proxy's own DDL in the capture's transaction fired a user's"
                              " event trigger, which may have changed the query's tables")
        entry = _Entry(Sketch(None, template, sql, params, (), ""), instance(sql, params),
                       analysis=analysis, session=incremental.SessionSettings.read(conn),
                       relations=relations, strategy=strategy, schemas=schemas)
        pipeline = None
        if not self._custom and self.strategy_of(entry) != "recapture":
            sketch_targets = [SketchTarget(t.table.index, t.column, t.partition)
                              for t in targets]
            try:
                self._refuse_too_large(tmpl)
                pipeline = self._compile(conn, analysis, sketch_targets, params)
            except NotMaintainable as exc:
                entry.ivm_off = str(exc)
                log.info("not maintained incrementally (%s): %s", exc, sql[:80])
        started = time.perf_counter()
        frags = None
        if pipeline is not None:
            frags = self._share(conn, tmpl, entry, pipeline)
            if frags is not None:
                pipeline = entry.pipeline
        if pipeline is not None and frags is None and incremental.tracked(conn, pipeline):
            if self._build_later(conn, tmpl, entry, pipeline):
                pipeline = None   # captured plainly now, its state built in the background
            else:
                frags = self._build_checked(conn, tmpl, entry, pipeline,
                                            contextlib.nullcontext(), sql, analysis, targets,
                                            params)
                if frags is None:   # refused: captured plainly
                    pipeline = None
                else:
                    self._count("state_builds")
        if pipeline is not None and frags is not None:
            parts = tuple(SketchPart(t.table, t.schema, t.column, t.partition, f, t.nullable)
                          for t, f in zip(targets, frags, strict=True))
            version = pipeline.version or ""
            entry.pipeline = pipeline
        else:
            if pipeline is not None:
                assert entry.session is not None
                self._queue_tracking(pipeline, entry.session)
            try:
                result = self.backend.capture(conn, sql, analysis, targets, params)
            except CaptureError:
                with self._lock:  # e.g. DDL changed a column: rebuild its partition next time
                    for t in targets:
                        self._partitions.pop((t.schema, t.partition.table, t.column), None)
                raise
            parts, version = result.parts, result.version
        self._seconds["capture_seconds"] += time.perf_counter() - started
        entry.sketch = self._store(conn, Sketch(None, template, sql, params, parts, version,
                                                self.strategy_of(entry)), relations)
        if entry.pipeline is not None:
            self._save_soon(conn, entry)
            self._ensure_background()  # eager batches, state persistence, GC
        return entry

    def _cross_check(self, conn: psycopg.Connection[Any], entry: _Entry, sql: str,
                     analysis: QueryAnalysis, targets: list[CaptureTarget],
                     params: Sequence[object] | None,
                     frags: tuple[frozenset[int], ...]) -> tuple[frozenset[int], ...] | None:
        """Safety belt: the state's sketch must contain the captured one (same snapshot), else
        the engine is wrong for this query — it keeps recapture (None), loudly."""
        if not self.settings.verify_state:
            return frags
        exact = self.backend.capture(conn, sql, analysis, targets, params)
        if all(f >= p.fragments for f, p in zip(frags, exact.parts, strict=True)):
            return frags
        self._engine_bug(entry, AssertionError(
            f"state sketch {[sorted(f) for f in frags]} misses captured "
            f"{[sorted(p.fragments) for p in exact.parts]} for {sql[:200]!r}"))
        return None

    def _store(self, conn: psycopg.Connection[Any], sketch: Sketch,
               relations: tuple[int, ...]) -> Sketch:
        if self.settings.persist:
            sketch = sketch.with_id(catalog.save_sketch(conn, sketch, relations))
            self._remember_own_xid(conn)
        else:
            with self._lock:
                self._stats["local_ids"] += 1
                sketch = sketch.with_id(-self._stats["local_ids"])
        return sketch

    def _targets(self, conn: psycopg.Connection[Any], analysis: QueryAnalysis,
                 safety: Safety) -> list[CaptureTarget]:
        resolved = {i: lookup.resolve_table(conn, t.qualifier, t.name)
                    for i, t in enumerate(analysis.tables)}
        safe = _exact(conn, analysis, safety.safe, resolved)
        targets = []
        for table_index, attrs in Safety(True, safety.reason, safe).by_table().items():
            table, names = analysis.tables[table_index], resolved[table_index]
            if names is None:
                continue
            schema, name = names
            targets.append(self._target(conn, table, schema, name,
                                        lookup.by_preference(conn, schema, name, attrs)))
        if not targets:
            raise SketchError("no sketchable base table (views or unknown relations)")
        return targets

    def _target(self, conn: psycopg.Connection[Any], table: TableRef, schema: str, name: str,
                attrs: Sequence[SafeAttribute]) -> CaptureTarget:
        """The first of ``attrs`` (best first) whose range partition can be built; raises the
        last attribute's PartitionError when none can (e.g. enums: psycopg cannot load
        their values)."""
        failed: PartitionError | None = None
        for attr in attrs:
            try:
                partition, nullable = self._partition(conn, schema, name, attr.column.column)
            except PartitionError as exc:
                failed = exc
                continue
            return CaptureTarget(table, schema, attr.column.column, partition, nullable)
        assert failed is not None
        raise failed

    def _partition(self, conn: psycopg.Connection[Any], schema: str, table: str,
                   column: str) -> tuple[RangePartition, bool]:
        key = (schema, table, column)
        with self._lock:
            cached = self._partitions.get(key)
        if cached is not None and cached[2] in (None, threading.get_ident()):
            return cached[0], cached[1]
        info = column_info(conn, schema, table, column)
        check_partitionable(info)  # also for a partition an older version saved
        nullable = not info.not_null
        partition = catalog.latest_partition(conn, *key) if self.settings.persist else None
        owner = None
        if (partition is None or partition.n + 1 > self.settings.fragments
                or partition.type_name != info.type_name):  # the column's type changed
            partition = build_partition(conn, schema, table, column, self.settings.fragments)
            if self.settings.persist:
                partition = catalog.save_partition(conn, partition)
                self._uncommitted().partitions.append(key)
                owner = threading.get_ident()
            self._remember_own_xid(conn)  # ANALYZE / ALTER … SET STATISTICS ran here
        with self._lock:
            self._partitions[key] = (partition, nullable, owner)
        return partition, nullable

    def committed(self) -> None:
        """The transaction of this thread's last :meth:`prepare` committed: the partitions it
        saved serve other threads from now on. Why not at once: another thread's capture
        transaction cannot see the row yet, and its sketch referring to it failed the
        foreign key (found: eight first captures of one table at once; the manager took the
        violation for a lost catalog and forgot every sketch of the database). A caller that
        never calls this only makes other threads read the partition from the catalog."""
        done: _Uncommitted | None = getattr(self._txn, "uncommitted", None)
        if done is None:
            return
        me = threading.get_ident()
        with self._lock:
            if done.installed:
                self._installed = True
                if self._installing == me:
                    self._installing = None
            for key in done.partitions:
                cached = self._partitions.get(key)
                if cached is not None and cached[2] == me:
                    self._partitions[key] = (cached[0], cached[1], None)

    # ---- catalog ---------------------------------------------------------------------

    def _ensure_catalog(self, conn: psycopg.Connection[Any]) -> None:
        """Installs the catalog if needed and, before anything of it is read (own xids here,
        sketches, states and tracked tables later), claims it for this database.

        A catalog this thread's transaction installed counts as installed for the other
        threads only once that transaction committed (:meth:`committed`, or their own look
        at the catalog): meanwhile their queries pass through (:class:`CatalogBusy`). Found:
        a second first query read ``imp.sketches`` before it existed for it and took that
        for a lost catalog, which forgot every sketch held, the first query's new one too."""
        if self._installed:
            return
        undo = self._uncommitted()
        if undo.installed:   # this transaction installed it
            return
        if self._install_deferred:
            self._ensure_background()   # one that gave up (server unreachable) starts anew
            raise CatalogBusy("schema imp is being brought up to date by the background thread")
        me = threading.get_ident()
        with self._lock:
            installer = self._installing
            if installer is None:
                self._installing = me
        if installer not in (None, me) and not catalog.is_installed(conn):
            raise CatalogBusy("schema imp is being installed by another query's transaction")
        try:
            undo.installed = self._install(conn)
            self._claim_or_defer(conn, installed=True)
            loaded = catalog.own_xids(conn)  # a previous run's catalog-only transactions
        finally:
            if not undo.installed:
                with self._lock:
                    if self._installing == me:
                        self._installing = None
        with self._lock:
            self._own_xids |= loaded
            if not undo.installed:
                self._installed = True

    def _install(self, conn: psycopg.Connection[Any]) -> bool:
        """:func:`catalog.ensure_installed` in a query's prepare, waiting at most
        :data:`INSTALL_LOCK_WAIT` for a lock. An install may track every table afresh (a DDL
        guard made or enabled anew: ``ddl_guard.sql``), and its DROP TRIGGER waits for the
        ACCESS SHARE the client's own backend holds on the query's tables while it prepares:
        then the background thread installs between queries, and queries pass through until
        it has (found in an upgrade from a version whose guard was not enabled ALWAYS: every
        query waited 2 s for the lock and passed through, for ever)."""
        try:
            return catalog.ensure_installed(conn, INSTALL_LOCK_WAIT)
        except psycopg.errors.LockNotAvailable:
            if self._conninfo is not None:
                self._install_deferred = True
                self._ensure_background()
            raise

    def install_deferred(self, conn: psycopg.Connection[Any]) -> None:
        """The install a query's prepare left to the background thread (:meth:`_install`),
        on its connection. It too waits at most :data:`INSTALL_LOCK_WAIT` for a lock, and
        after each failure twice as long as before until it tries again (at most
        :data:`INSTALL_RETRY_MAX`): its queued ACCESS EXCLUSIVE request holds every later
        reader of the table up (found by a regression search in session 26: behind a
        client's open transaction every reader of the table waited 2 s of every 2.25)."""
        if not self._install_deferred or self._clock() < self._install_retry_at:
            return
        try:
            with conn.transaction():
                catalog.ensure_installed(conn, INSTALL_LOCK_WAIT)
        except psycopg.errors.LockNotAvailable as exc:
            self._install_backoff = min(INSTALL_RETRY_MAX, 2 * self._install_backoff)
            self._install_retry_at = self._clock() + self._install_backoff
            log.info("schema imp not yet brought up to date (%s): again in %.1f s",
                     str(exc).strip(), self._install_backoff)
            return
        self._install_deferred = False
        self._install_backoff = INSTALL_RETRY_FIRST / 2
        log.info("schema imp brought up to date")

    def _claim_or_defer(self, conn: psycopg.Connection[Any], installed: bool = False) -> None:
        """:meth:`claim_identity` in a query's prepare. The claim drops audit triggers (ACCESS
        EXCLUSIVE), and the client's backend holds ACCESS SHARE on the query's tables while
        the prepare runs: when the claim's lock wait times out, the background thread claims
        between queries (its connection claims first), and the prepare fails (the query
        passes through)."""
        try:
            self.claim_identity(conn, installed)
        except psycopg.errors.LockNotAvailable:
            self._ensure_background()
            raise

    def claim_identity(self, conn: psycopg.Connection[Any], installed: bool = False) -> bool:
        """:func:`catalog.claim_identity` once per manager (again after a rollback of it, a
        lost catalog or a restart of PostgreSQL), before the first read of schema ``imp`` on
        any path: a query's prepare (:meth:`_ensure_catalog`, or directly without
        persistence) and the background thread's connection (tracking, maintenance,
        persistence, GC). True when it discarded another database's state (restored by
        pg_dump / pg_restore): then whatever the manager holds is forgotten too. ``installed``:
        the caller knows schema ``imp`` is (else one round trip more checks it)."""
        if self._claimed:
            return False
        discarded = catalog.claim_identity(conn, installed)
        if conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
            self._uncommitted().claimed = True
        self._claimed = True
        if discarded:
            log.warning("schema imp held the state of another database (restored from a dump):"
                        " discarded, and everything held in memory forgotten")
            self._count("foreign_state_discarded")
            with self._lock:
                self._evicted.clear()   # ids of the discarded catalog
            self._forget_held(judge_catalog_again=False)
        return discarded

    def prune_own_xids(self, conn: psycopg.Connection[Any], low: int) -> int:
        """Forgets the recorded own transactions older than ``low`` (``incremental.horizon``:
        every snapshot open now or taken later sees them) and than every held sketch's
        version, in memory and in ``imp.own_xacts`` (there also older than every valid
        sketch's version as a restart would load it: :data:`_PRUNE_OWN_XACTS`), for the
        background thread; returns how many it forgot in memory.

        Why: both only grew while the proxy ran (about one per saved state and capture: 11 a
        second under writes), and the whole set is copied on every prepare and sent with every
        freshness check. Why it is safe: the freshness check asks about the transactions
        between a sketch's version and the query's snapshot, and one older than both is seen
        by both; a sketch loaded later with an older version at worst counts a forgotten own
        transaction as a change (one maintenance or capture more), never the reverse."""
        with self._lock:
            versions = [e.sketch.version for t in self._templates.values()
                        for e in t.entries if e.sketch.version]
        bound = min([low, *(deltas.Snapshot.parse(v).xmin for v in versions)])
        with self._lock:
            before = len(self._own_xids)
            self._own_xids = {x for x in self._own_xids if x >= bound}
            forgotten = before - len(self._own_xids)
        if self.settings.persist and catalog.is_installed(conn) and incremental.installed(conn):
            conn.execute(_PRUNE_OWN_XACTS, (str(bound),))
        return forgotten

    def _remember_own_xid(self, conn: psycopg.Connection[Any]) -> None:
        """Records this transaction as a catalog-only one (``sketches.freshness``), or
        forgets it again once the manager's DDL in it fired a user's event trigger."""
        xid = freshness.current_xid(conn)
        if freshness.user_triggers_ran(conn):
            log.info("a user's event trigger fired on the proxy's own DDL in transaction"
                     " %d: it counts as a change of the data", xid)
            if self.settings.persist:
                catalog.forget_own_xid(conn, xid)
            with self._lock:
                self._own_xids.discard(xid)
            return
        if self.settings.persist:
            catalog.record_own_xid(conn, xid)
        with self._lock:
            self._own_xids.add(xid)

    def _load(self, conn: psycopg.Connection[Any], template: str, tmpl: _Template,
              relations: lookup.Relations) -> None:
        """The catalog's sketches of ``template`` that were captured on ``relations`` and are
        not held yet; the others are loaded when a query reads their relations."""
        loaded: list[_Entry] = []
        held = {e.sketch.id for e in tmpl.entries}
        others, seen = catalog.other_settings(conn, template), time.time()
        with self._lock:
            evicted = set(self._evicted)
            for sid in others:
                self._other_settings.setdefault(sid, seen)
        for stored in catalog.load_sketches(conn, template):
            if stored.id in evicted or stored.id in held:   # evicted, not yet invalidated
                continue
            try:
                stored_analysis = analyse(stored.query, lookup.resolver(conn))
            except UnsupportedQuery:
                continue
            by_alias = {t.alias: t for t in stored_analysis.tables}
            if any(a not in by_alias for a in stored.aliases) \
                    or not _captured_on(stored, by_alias, relations):
                continue
            parts = tuple(
                SketchPart(by_alias[a], p.schema, c, p, f)
                for a, c, p, f in zip(stored.aliases, stored.columns, stored.partitions,
                                      stored.fragments, strict=True))
            # the engine needs the values, the instance their numbers (a text parameter is
            # no threshold), both as bound
            typed = stored.typed_params()
            if stored.params is not None and typed is None:
                continue
            entry = _Entry(Sketch(stored.id, template, stored.query,
                                  stored.params if self._custom else typed, parts,
                                  stored.version, stored.strategy),
                           instance(stored.query, typed), stored.captures,
                           stored.maintenances, stored.uses, analysis=stored_analysis,
                           session=incremental.SessionSettings.read(conn))
            entry.relations = relations.oids
            loaded.append(entry)
        # newest first: a catalog holding more than the template may keep (written before
        # the cap was enforced, by another proxy, or under a larger setting) loads the newest;
        # the others are invalidated by the background thread
        room = max(self.settings.sketches_kept_per_template - len(tmpl.entries), 0)
        surplus = [e.sketch.id for e in loaded[room:] if e.sketch.id is not None]
        if surplus:
            self._queue_unpersist(surplus)
            self._count("evicted", len(surplus))
            self._ensure_background()
        tmpl.entries.extend(loaded[:room])
        tmpl.loaded_on.add(relations.oids)

    def _forget(self, tmpl: _Template, entry: _Entry) -> None:
        """A sketch that can no longer be refreshed, forgotten as an eviction is
        (:meth:`_evict`: its catalog row and saved state go in the background's own
        transaction). Found: deleted in the prepare's snapshot, the saved state could conflict
        with the background's later save of it (``could not serialize access``), and the
        query lost its sketch; and had the prepare failed after it, its rollback would have
        kept the row valid and the state holding the audit-row collection back."""
        self._evict(tmpl, entry)
        self._ensure_background()
        self._count("invalidated")

    def flush_counters(self, conn: psycopg.Connection[Any]) -> None:
        """Writes the in-memory use/maintenance counters to the catalog (counters are kept in
        memory on the hot path so concurrent uses never conflict on a catalog row)."""
        with self._lock:
            entries = [e for t in self._templates.values() for e in t.entries]
        for e in entries:
            if e.sketch.id is not None and e.sketch.id > 0 and (e.uses or e.maintenances):
                catalog.update_counters(conn, e.sketch.id, e.uses, e.maintenances)
                e.uses = e.maintenances = 0
        self._remember_own_xid(conn)

    # ---- admin -----------------------------------------------------------------------

    def get(self, sketch_id: int) -> Sketch | None:
        """The sketch with this id, if the manager holds it."""
        with self._lock:
            for t in self._templates.values():
                for e in t.entries:
                    if e.sketch.id == sketch_id:
                        return e.sketch
        return None

    def sketches(self) -> list[dict[str, object]]:
        """One row per sketch held (IMP SHOW SKETCHES): sketch_id, template, query, tables,
        attributes, fragments (per table: fragments of its partition), selected_fragments
        (per table: fragments in the sketch), coverage, version, strategy, captures,
        maintenances, uses, last_used (ISO UTC)."""
        rows: list[dict[str, object]] = []
        with self._lock:
            for template, t in self._templates.items():
                for e in t.entries:
                    s = e.sketch
                    last = None if e.last_used is None else datetime.fromtimestamp(
                        e.last_used, UTC).isoformat(timespec="seconds")
                    rows.append({
                        "sketch_id": s.id, "template": template, "query": s.query,
                        "tables": [f"{p.schema}.{p.partition.table}" for p in s.parts],
                        "attributes": [p.column for p in s.parts],
                        "fragments": [p.partition.fragment_count for p in s.parts],
                        "selected_fragments": [len(p.fragments) for p in s.parts],
                        "coverage": round(max(p.coverage for p in s.parts), 4),
                        "version": s.version, "strategy": self.strategy_of(e),
                        "captures": e.captures, "maintenances": e.maintenances,
                        "uses": e.uses, "last_used": last,
                    })
        return rows

    def stats(self) -> dict[str, object]:
        with self._lock:
            out: dict[str, object] = dict(self._stats)
            out["templates"] = len(self._templates)
            out["sketches"] = sum(len(t.entries) for t in self._templates.values())
            out["classify_cache"] = len(self._classified)
            out["fallback_maintenance"] = self.maintenance.name   # sketches without a state
            out["strategy"] = self.settings.strategy
            for key in ("capture_seconds", "maintenance_seconds"):
                out[key] = round(self._seconds[key], 4)
            out["incremental_sketches"] = sum(
                1 for t in self._templates.values() for e in t.entries if e.pipeline)
        backend_stats = getattr(self.backend, "stats", None)
        if callable(backend_stats):  # heavy backend: mode, Spark status, jobs, fallbacks
            out.update(backend_stats())
        else:
            out["heavy_backend"] = self.backend.name
        return out

    def explain_backend(self, conn: psycopg.Connection[Any], sql: str,
                        params: Sequence[object] | None = None) -> list[tuple[str, object]]:
        """``IMP EXPLAIN`` rows ``heavy_backend`` / ``heavy_backend_reason``: where a capture
        of ``sql`` would run now, and why (in conn's snapshot; nothing is run or recorded)."""
        explain = getattr(self.backend, "explain", None)
        if explain is None:
            return [("heavy_backend", self.backend.name),
                    ("heavy_backend_reason", "the only backend configured")]
        try:
            analysis, safety, _c = self._analyse(conn, sql, _search_path(conn), again=True)
            if not safety.sketchable:
                return [("heavy_backend", None), ("heavy_backend_reason", safety.reason)]
            targets = self._targets(conn, analysis, safety)
            choice = explain(conn, sql, analysis, targets,
                             tuple(params) if params is not None else None)
        except (SketchError, BackendError) as exc:
            return [("heavy_backend", None), ("heavy_backend_reason", str(exc))]
        log.info("heavy backend for %s: %s (%s)", sql[:80], choice.backend, choice.reason)
        return [("heavy_backend", choice.backend), ("heavy_backend_reason", choice.reason)]

    def drop(self, conn: psycopg.Connection[Any], sketch_id: int) -> bool:
        dropped: list[tuple[_Template, _Entry]] = []
        with self._lock:
            for t in self._templates.values():
                for e in list(t.entries):
                    if e.sketch.id == sketch_id:
                        t.entries.remove(e)
                        dropped.append((t, e))
        self._detach_all(dropped)
        found = bool(dropped)
        if self.settings.persist:
            self._ensure_catalog(conn)
            found = catalog.delete_sketch(conn, sketch_id) or found
            if incremental.installed(conn):
                ivm_state.delete(conn, str(sketch_id))
        return found

    def _drop_in_memory(self, loaded: bool) -> int:
        """Forgets every sketch held; ``loaded``: whether templates then still read the
        catalog's sketches (not after a drop, whose catalog rows go too)."""
        with self._lock:
            dropped = [(t, e) for t in self._templates.values() for e in t.entries]
            for t in self._templates.values():
                t.entries.clear()
                t.loaded = loaded
                t.loaded_on.clear()
        self._detach_all(dropped)
        return len(dropped)

    def _detach_all(self, dropped: list[tuple[_Template, _Entry]]) -> None:
        """Detaches dropped entries, each under its template's lock: a capture of that
        template may be adding a head to the same pipeline (taken after the manager's lock,
        whose holders never wait for a template lock)."""
        for t, e in dropped:
            with t.lock:
                self.detach(e)

    def drop_all(self, conn: psycopg.Connection[Any]) -> int:
        count = self._drop_in_memory(loaded=True)
        if self.settings.persist:
            self._ensure_catalog(conn)
            count = max(count, catalog.delete_all(conn))
            if incremental.installed(conn):
                conn.execute("DELETE FROM imp.ivm_state")
        return count


_PRUNE_OWN_XACTS = (
    "DELETE FROM imp.own_xacts WHERE xid < least(%s::text::xid8,"
    " (SELECT min(pg_snapshot_xmin(coalesce(st.version, s.version))) FROM imp.sketches AS s"
    "  LEFT JOIN imp.ivm_state AS st ON st.sketch_key = s.id::text WHERE s.valid))")
"""The rows of ``imp.own_xacts`` a restarted manager cannot need: older than the bound given
and than every valid sketch's version as it would be loaded (its persisted state's, else
the catalog's)."""

STOP_POLL = 0.05
"""Seconds between looks at a prepare's ``stop`` while it waits for its template's lock."""
EVICTED_RETRY = 120.0
"""Seconds an evicted sketch whose catalog row is not visible yet (its capture's transaction
has not committed) is looked for again (``SketchManager.unpersist_evicted``)."""


def _may_not_read(conn: psycopg.Connection[Any], role: str | None,
                  oids: Sequence[int]) -> str | None:
    """Why the query passes through when ``role`` lacks SELECT on one of the relations
    ``oids`` (its column privileges do not count: PostgreSQL answers such a role itself),
    else None; one round trip on conn (see :meth:`SketchManager.prepare`'s ``role``)."""
    if role is None or not oids:
        return None
    row = conn.execute("SELECT pg_catalog.bool_and(pg_catalog.has_table_privilege("
                       "%s::text::name, c, 'SELECT')) FROM pg_catalog.unnest(%s::oid[]) AS c",
                       (role, list(oids))).fetchone()
    if row is not None and row[0] is True:
        return None
    return ("the session's role may not SELECT every table of the query: PostgreSQL answers "
            "it itself (no sketch work on the service role's authority)")


@contextlib.contextmanager
def _held(lock: threading.Lock, stop: threading.Event | None,
          deadline: float | None = None) -> Iterator[None]:
    """``lock`` held inside; waited for until ``stop`` is set (then :class:`Interrupted`) or
    the ``time.monotonic()`` ``deadline`` passed (then :class:`TemplateBusy`)."""
    if stop is None and deadline is None:
        lock.acquire()
    else:
        while not lock.acquire(timeout=STOP_POLL):
            if stop is not None and stop.is_set():
                raise Interrupted("stopped while waiting for another prepare of the template")
            if deadline is not None and time.monotonic() >= deadline:
                raise TemplateBusy("another prepare or maintenance of the query's template "
                                   "held it longer than template_wait")
    try:
        yield
    finally:
        lock.release()


def _exact(conn: psycopg.Connection[Any], analysis: QueryAnalysis,
           safe: Sequence[SafeAttribute],
           resolved: dict[int, tuple[str, str] | None]) -> tuple[SafeAttribute, ...]:
    """``safe`` without the attributes only join-equivalent to their key through equalities
    that cast (:func:`sketches.safety.exact_equalities`; a class with a view or an unknown
    table is not known to be exact)."""
    direct = tuple(a for a in safe if a.direct)
    if len(direct) == len(safe):
        return direct
    classes = equivalence_classes(analysis)
    members = sorted({c for a in safe if not a.direct for c in classes.get(a.key, ())},
                     key=lambda c: (c.table, c.column))
    names = [resolved[c.table] for c in members]
    if any(n is None for n in names):
        return direct
    found = lookup.column_types(conn, [(*n, c.column) for c, n in zip(members, names,
                                                                       strict=True) if n])
    types = dict(zip(members, found, strict=True))
    return tuple(a for a in safe if a.direct or exact_equalities(
        types[c] for c in classes.get(a.key, ())))


def _captured_on(stored: catalog.StoredSketch, by_alias: dict[str, TableRef],
                 relations: lookup.Relations) -> bool:
    """Was ``stored`` captured on ``relations``? A row of an older version keeps only its
    sketched tables' names: then every table of the query must be one of them."""
    if stored.relations is not None:
        return stored.relations == relations.oids
    return len(set(stored.aliases)) == len(relations.oids) and all(
        relations.names[by_alias[a].index] == (p.schema, p.table)
        for a, p in zip(stored.aliases, stored.partitions, strict=True))


def _partition_unseen(exc: psycopg.Error) -> bool:
    """Did a sketch refer to a partition its transaction cannot see? Another thread's capture
    saved it and committed after this transaction's snapshot was taken (found: eight first
    captures of one table at once; taken for a lost catalog, it made the manager forget every
    sketch of the database). The query passes through; the next one reads the partition."""
    return (isinstance(exc, psycopg.errors.ForeignKeyViolation)
            and exc.diag.constraint_name == "sketch_fragments_partition_id_fkey")


def _catalog_gone(exc: psycopg.Error) -> bool:
    """Is ``exc`` a table of schema imp missing, or a catalog row the manager referred to?"""
    if isinstance(exc, psycopg.errors.ForeignKeyViolation):
        return exc.diag.schema_name == "imp"
    return isinstance(exc, psycopg.errors.UndefinedTable) \
        and '"imp.' in (exc.diag.message_primary or "")


TEMPORAL_FUNCTIONS = frozenset({"date_part", "extract", "date_trunc"})
"""The supported functions that take a date, time or interval. An untyped literal passed to
one is ambiguous in PostgreSQL 15 (``date_part('month', '01/02/2020')`` is an error); should
an overload make it resolve, it would be read as a date under the session's DateStyle, so
queries calling them count as reading such a value."""

_SETTINGS_FREE_TYPES = (type(None), bool, int, float, Decimal, str, bytes)
"""Parameter values whose meaning no TimeZone, DateStyle or IntervalStyle changes (a text
value's type comes from the columns and casts around it, which ``Relations.settings_free``
checks)."""


def _param_values(params: Sequence[object] | None) -> Iterator[object]:
    """The parameter values, a list's elements in its place."""
    for v in params or ():
        if isinstance(v, (list, tuple)):
            yield from _param_values(v)
        else:
            yield v


def _settings_free_values(params: Sequence[object] | None) -> bool:
    """No parameter holds a date, time, interval or other value of a settings-dependent
    text (lists: each element)."""
    return all(isinstance(v, _SETTINGS_FREE_TYPES) for v in _param_values(params))


def _schemas(analysis: QueryAnalysis, names: Sequence[tuple[str, str]]) -> Schemas:
    """Each table's schema as ``names`` (``lookup.Relations.names``) resolved it."""
    return tuple((t.scope, t.alias, names[t.index][0]) for t in analysis.tables)


def _pin_schemas(entry: _Entry, schemas: Schemas) -> bool:
    """Has every text made for ``entry`` (instrumented query, capture, state build, delta
    reads: its ``analysis``) name the query's tables in ``schemas``, those the wrapping
    resolved and locked in the query's snapshot. False when its texts name others already:
    a table moved to another schema since, keeping its oid (the caller forgets the entry).
    An entry loaded from the catalog is pinned at its first use."""
    if entry.schemas == schemas:
        return True
    if entry.schemas:
        return False
    entry.schemas = schemas
    entry.instrumented.clear()
    if entry.analysis is not None:
        entry.analysis = entry.analysis.with_schemas(schemas)
    return True


def _search_path(conn: psycopg.Connection[Any]) -> str:
    """The schemas conn resolves names through (:data:`lookup.EFFECTIVE_SEARCH_PATH`)."""
    row = conn.execute("SELECT " + lookup.EFFECTIVE_SEARCH_PATH).fetchone()
    return str(row[0]) if row else ""


def _clock_values(params: Sequence[object] | None) -> bool:
    """Does a text parameter (lists: an element) read the clock like a literal of
    :func:`~sketches.sql.grammar.reads_the_clock`?"""
    return any(isinstance(v, str) and reads_the_clock(v) for v in _param_values(params))


def _values(inst: TemplateInstance) -> tuple[object, ...]:
    """The values that tell instances of one template apart."""
    return (inst.thresholds, inst.limit)


def _same_values(a: TemplateInstance, b: TemplateInstance) -> bool:
    return _values(a) == _values(b)
