"""Incremental maintenance of the manager's sketches (docs/MAINTENANCE.md): the entries the
manager holds and the :class:`IncrementalMaintenance` part of ``SketchManager``.

Per entry the strategy is ``lazy`` (brought to the query's snapshot by the query itself),
``eager`` (also maintained in batches by the background thread, :mod:`sketches.background`) or
``recapture`` (``RecaptureOnChange``: kept while nothing changed, else captured anew; also the
fate of queries the engine cannot maintain exactly). Every step that touches an entry's
pipeline runs under its template's lock, so a state's version only moves forward.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections import OrderedDict, defaultdict, deque
from collections.abc import Hashable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg

from sketches import deltas, incremental, lookup
from sketches.backends.base import BackendError
from sketches.capture import CaptureTarget
from sketches.errors import CaptureError
from sketches.ivm import collector
from sketches.ivm import state as ivm_state
from sketches.ivm.codec import Json
from sketches.ivm.errors import IvmError, NotMaintainable, PipelineBroken, StateTooLarge
from sketches.ivm.pipeline import Head, Pipeline
from sketches.ivm.plan import SketchTarget, state_analysis
from sketches.lru import Lru
from sketches.maintenance import MaintenanceRequest, MaintenanceStrategy
from sketches.sketch import Sketch
from sketches.sql import QueryAnalysis
from sketches.sql.rewrite import Schemas
from sketches.sql.template import TemplateInstance

if TYPE_CHECKING:
    from sketches.backends.base import AggregateState, ExecutionBackend
    from sketches.manager import SketchSettings

log = logging.getLogger(__name__)

BUILD_IN_BACKGROUND = 200_000
"""Rows of a query's tables (``pg_class.reltuples``, summed) beyond which its state is built
by the background thread, not by the query that needs it
(:meth:`IncrementalMaintenance._build_later`), unless PostgreSQL estimates the state's
groups at most :data:`GROUPS_INLINE`."""

GROUPS_INLINE = 50_000
"""Estimated (group, fragment) pairs of an aggregation's state up to which it is built by the
query that needs it, however many rows its tables hold. Why: the build's Python side takes
about 14 µs per group (0.7 s here); in the background, the build competed for the process
with the queries timed right after a capture (found: the demo's 10,000 groups over 1M rows,
first table 2.6× and 5.5× faster than PostgreSQL instead of about 8×)."""

_ROWS_UNDER = (
    "WITH RECURSIVE d(oid) AS (SELECT unnest(%s::oid[]) UNION SELECT h.inhrelid"
    " FROM pg_catalog.pg_inherits AS h JOIN d ON h.inhparent = d.oid)"
    " SELECT coalesce(sum(greatest(c.reltuples, 0)), 0)::float8"
    " FROM d JOIN pg_catalog.pg_class AS c ON c.oid = d.oid")
"""The rows of some tables with their inheritance children and partitions (a partitioned
table's own ``reltuples`` is -1)."""

SAVE_BACKOFF = 10
"""A state is saved by the background at most once per this many times its last save's
duration (besides ``state_interval``). Why: the state is copied under its template's lock,
and a 1M-group state took 3–8 s to copy; saved every ``state_interval`` (10 s) under writes,
its queries waited about half the time. Only a restart needs the saved state: the
garbage collection is bounded by the versions in memory too."""

SAVE_IN_BACKGROUND = 50_000
"""Groups (or rows) beyond which a new state is persisted by the background thread, not by
the query that built it (:meth:`IncrementalMaintenance._save_soon`)."""

# Python-level failures of the engine (not database errors, which abort the transaction and
# propagate to the caller): the sketch is kept exact by recapture instead.
ENGINE_BUGS = (TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError,
               AssertionError)


def _with_fragments(sketch: Sketch, frags: Sequence[frozenset[int]], version: str) -> Sketch:
    """``sketch`` with these fragments per part, valid at ``version``."""
    parts = tuple(dataclasses.replace(p, fragments=f)
                  for p, f in zip(sketch.parts, frags, strict=True))
    return sketch.with_state(parts, version)


def names_refused(conn: psycopg.Connection[Any], entry: Entry) -> str | None:
    """Why the entry's query would now pass through, checked as a query checks it
    (:func:`sketches.lookup.relations`) in this snapshot and on the query's search_path, else
    None. Why: the background's delta reads and state builds evaluate the query's
    expressions as the service role, and a function or operator created since the capture
    may win the names (found: a role's ``s.round(int)``, created after its query was
    captured with pg_catalog's ``round``, ran in eager maintenance as the service role and
    made the role SUPERUSER)."""
    if entry.analysis is None:
        return "no analysis of the query"
    return lookup.relations(conn, entry.analysis).reason


@dataclass(slots=True)
class Reuse:
    """Whether a query used a sketch again after the one that captured it
    (``SketchManager._note_use``). Held by the sketch's :class:`Entry` and by its template's
    :attr:`Template.recent`, which outlives the entry without keeping its state alive."""

    used: bool = False


RECENT_CAPTURES_KEPT = 32
"""Captures remembered per template (:attr:`Template.recent`): the most
``SketchSettings.unreused_captures`` may look at."""


@dataclass
class Entry:
    """A sketch known to the manager with its template instance and counters."""

    sketch: Sketch
    instance: TemplateInstance
    captures: int = 1
    maintenances: int = 0
    uses: int = 0
    last_used: float | None = None
    """When a query last used it in this process (``time.time()``; None: never)."""
    since: float = field(default_factory=time.time)
    """When this process captured or loaded it: its last use for eviction until it is used
    (``SketchManager.evict_idle``)."""
    instrumented: Lru[str, str | None] = field(
        default_factory=lambda: Lru(INSTRUMENTED_KEPT, INSTRUMENTED_CHARS))
    """Instrumented text per query text, valid for ``sketch`` as it is (cleared on change);
    at most ``INSTRUMENTED_KEPT`` texts of ``INSTRUMENTED_CHARS`` characters in all
    (:meth:`remember_instrumented`)."""
    analysis: QueryAnalysis | None = None
    session: incremental.SessionSettings | None = None
    strategy: str | None = None
    """Per-sketch strategy (None: ``SketchSettings.strategy``)."""
    pipeline: Pipeline | None = None
    head: Head | None = None
    """The sketch's head when ``pipeline`` is another sketch's, shared (None: its own)."""
    ivm_off: str | None = None
    """Why the sketch is not maintained incrementally (then: recapture on change)."""
    dirty: bool = False
    save_seconds: float = 0.0
    """How long the background's last save of its state took, and when it ended
    (``time.monotonic()``): the next one waits ``SAVE_BACKOFF`` times that long."""
    saved_at: float = 0.0
    building: bool = False
    """A build of its state is queued for, or running in, the background thread (its
    queries are answered by recapture meanwhile: :meth:`IncrementalMaintenance._build_later`)."""
    last_maintained: float = field(default_factory=time.monotonic)
    reusable_for: dict[int, tuple[Any, bool]] = field(default_factory=dict)
    """``reusable(instance, other)`` per other instance (``SketchManager._reusable``)."""
    relations: tuple[int, ...] = ()
    """The oids of the query's tables the sketch was captured on (``lookup.Relations``)."""
    schemas: Schemas = ()
    """The schema of each table of the query, as its capture (or first use after a restart)
    resolved the names: ``analysis`` carries them, and every text made for the sketch — the
    ``instrumented`` ones, the capture, the state build, the delta reads — qualifies them
    (``sketches.sql.rewrite.Schemas``, ``SketchManager`` ``_pin_schemas``)."""
    reuse: Reuse = field(default_factory=Reuse)

    def idle_since(self) -> float:
        """Its last use in this process, else when it was captured or loaded."""
        return self.since if self.last_used is None else max(self.last_used, self.since)

    def remember_instrumented(self, sql: str, text: str | None) -> None:
        """Keeps ``text`` as the instrumented ``sql``, dropping the least recently used texts
        beyond the bounds (the caller holds the template lock). Why bounded: one sketch
        serves every text of its query — comments, ORM tags — and each text kept its
        instrumented copy for as long as the sketch stayed unchanged (found: ~2.5 KiB per
        distinct comment, without limit; in characters too since session 28: 256 texts of
        256 KiB made 128 MiB); a text dropped is instrumented again."""
        self.instrumented.put(sql, text)


INSTRUMENTED_KEPT = 256
"""Instrumented texts kept per sketch (``Entry.remember_instrumented``)."""

INSTRUMENTED_CHARS = 4 << 20
"""Characters of query and instrumented texts kept per sketch."""


@dataclass
class Template:
    lock: threading.Lock = field(default_factory=threading.Lock)
    seen: int = 0
    loaded: bool = False
    """The catalog holds no sketch of the template this process has not loaded (after a drop
    of them all)."""
    loaded_on: set[tuple[int, ...]] = field(default_factory=set)
    """The relations (``lookup.Relations.oids``) the catalog's sketches captured on were
    loaded for. Why per relations: the same text names other tables under another search
    path, and the catalog keeps the sketches of each; loading once per template restored only
    the first path's after a restart, and the others were captured again."""
    too_large: int = 0
    """The ``max_state_rows`` under which a state build of the template gave up (0: none):
    no build is tried again under that limit or a lower one."""
    entries: list[Entry] = field(default_factory=list)
    runs: OrderedDict[Hashable, int] = field(default_factory=OrderedDict)
    """Executions per parameter values (the most recent ``_RUNS_KEPT`` values)."""
    recent: deque[Reuse] = field(default_factory=lambda: deque(maxlen=RECENT_CAPTURES_KEPT))
    """Whether each of the template's latest captures in this process was used again,
    oldest first."""
    queries: OrderedDict[int, int] = field(default_factory=OrderedDict)
    """Executions per query (the hash of its text and parameters; the most recent
    ``_RUNS_KEPT``)."""

    def unreused(self, n: int) -> bool:
        """Were the template's last ``n`` captures (n ≥ 1) each never used again?"""
        recent = self.recent
        return len(recent) >= n and not any(recent[-i].used for i in range(1, n + 1))

    def note_values(self, values: Hashable) -> int:
        """Counts one execution of ``values``; returns how many there were so far."""
        return _note(self.runs, values)

    def note_query(self, key: Hashable | None) -> int:
        """Counts one execution of the query ``key`` (``answers.query_key``; None: one not
        told apart, counted as new); returns how many there were so far. Why a hash: a
        text may be long; two queries of one hash are counted as one, which only makes
        a capture come earlier."""
        return 1 if key is None else _note(self.queries, hash(key))

    def ran(self, key: Hashable) -> bool:
        """Was the query ``key`` counted by :meth:`note_query` (among the most recent)?"""
        return hash(key) in self.queries


def _note(counts: OrderedDict[Any, int], key: Hashable) -> int:
    n = counts.pop(key, 0) + 1
    counts[key] = n
    if len(counts) > _RUNS_KEPT:
        counts.popitem(last=False)
    return n


_RUNS_KEPT = 256


def capture_targets(sketch: Sketch) -> list[CaptureTarget]:
    """The capture targets of a sketch's parts (for the heavy backend's jobs)."""
    return [CaptureTarget(p.table, p.schema, p.column, p.partition, p.nullable)
            for p in sketch.parts]


class IncrementalMaintenance:
    """Mixin of ``SketchManager``: strategies, pipelines, the background thread's seam."""

    settings: SketchSettings
    maintenance: MaintenanceStrategy
    backend: ExecutionBackend
    _custom: bool
    _lock: threading.Lock
    _templates: dict[str, Template]
    _conninfo: dict[str, Any] | None
    _to_track: dict[str, incremental.SessionSettings]
    _to_build: list[tuple[Template, Entry, Pipeline]]
    _unsaved: set[int]
    _background: Any
    _seconds: defaultdict[str, float]

    def _count(self, key: str, n: int = 1) -> None:
        raise NotImplementedError

    def _remember_own_xid(self, conn: psycopg.Connection[Any]) -> None:
        raise NotImplementedError

    def _cross_check(self, conn: psycopg.Connection[Any], entry: Entry, sql: str,
                     analysis: QueryAnalysis, targets: list[CaptureTarget],
                     params: Sequence[object] | None,
                     frags: tuple[frozenset[int], ...]) -> tuple[frozenset[int], ...] | None:
        raise NotImplementedError

    # ---- incremental maintenance (docs/MAINTENANCE.md) ----------------------------------

    def strategy_of(self, entry: Entry) -> str:
        """The strategy that keeps ``entry`` up to date."""
        if self._custom:
            return self.maintenance.name
        if entry.ivm_off is not None:
            return "recapture"
        return entry.strategy or self.settings.strategy

    def kept_by_engine(self, entry: Entry) -> bool:
        """Whether ``entry`` is kept by the engine (lazy or eager), not by recapture."""
        return self.strategy_of(entry) in ("lazy", "eager")

    def _refresh(self, conn: psycopg.Connection[Any], entry: Entry,
                 request: MaintenanceRequest, snapshot: str | None = None,
                 tmpl: Template | None = None) -> Sketch | str | None:
        """The entry's sketch valid in conn's snapshot; None: recapture; a string: pass this
        query through for that reason (the sketch stays). ``snapshot``: conn's transaction
        snapshot when conn is in a REPEATABLE READ / SERIALIZABLE transaction (every later
        statement of it, the instrumented query's included, sees exactly that), else None.
        ``tmpl``: the entry's template (its lock held), whose pipelines a new state may share."""
        if not self.kept_by_engine(entry):
            return self.maintenance.refresh(conn, entry.sketch, request)
        if entry.pipeline is None and not self._attach(conn, entry, tmpl):
            if entry.building:
                return self._recapture_in_place(conn, entry, request)
            return self.maintenance.refresh(conn, entry.sketch, request)
        if self._background is None:  # it gave up earlier (database unreachable)
            self._ensure_background()
        return self._maintain(conn, entry, snapshot)

    def _attach(self, conn: psycopg.Connection[Any], entry: Entry,
                tmpl: Template | None = None) -> bool:
        """Gives ``entry`` its pipeline: the persisted state (restart), else a head on a
        pipeline of ``tmpl`` it can share (:meth:`_share`), else one built in this snapshot
        (a capture). False when the engine cannot maintain the query or the tables' tracking
        is not visible yet.

        Why share here too: the sketches a template gets before its tables are tracked are
        captured plainly, and each would build a state of its own at its first maintenance."""
        sketch = entry.sketch
        if entry.building:
            return False
        try:
            if entry.analysis is None:
                raise NotMaintainable("the sketch's query could not be analysed")
            self._refuse_too_large(tmpl)
            targets = [SketchTarget(p.table.index, p.column, p.partition) for p in sketch.parts]
            pipeline = self._compile(conn, entry.analysis, targets, sketch.params)
        except NotMaintainable as exc:
            entry.ivm_off = str(exc)
            return False
        assert entry.session is not None
        if not incremental.tracked(conn, pipeline):
            self._queue_tracking(pipeline, entry.session)
            return False
        started = time.perf_counter()
        if self.settings.persist and sketch.id is not None and sketch.id > 0:
            try:
                if ivm_state.load(conn, str(sketch.id), pipeline):
                    entry.pipeline = pipeline
                    self._apply(entry, pipeline.sketch(), pipeline.version or "")
                    self._ensure_background()
                    self._count("states_loaded")
                    log.info("sketch %s: state reloaded at %s", sketch.id, pipeline.version)
                    return True
            except IvmError as exc:
                log.info("sketch %s: persisted state unusable (%s): rebuilding", sketch.id, exc)
        shared = None if tmpl is None else self._share(conn, tmpl, entry, pipeline)
        if shared is not None:
            assert entry.pipeline is not None
            self._apply(entry, shared, entry.pipeline.version or "")
            self._save_soon(conn, entry)
            return True
        if tmpl is not None and self._build_later(conn, tmpl, entry, pipeline):
            return False
        frags = self._build_checked(conn, tmpl, entry, pipeline, contextlib.nullcontext(),
                                    sketch.query, entry.analysis, capture_targets(sketch),
                                    sketch.params)
        if frags is None:
            return False
        self._seconds["capture_seconds"] += time.perf_counter() - started
        entry.pipeline = pipeline
        entry.captures += 1
        self._count("captures")
        self._count("state_builds")
        self._apply(entry, frags, pipeline.version or "")
        self._save_soon(conn, entry)
        self._ensure_background()
        return True

    def _build_checked(self, conn: psycopg.Connection[Any], tmpl: Template | None,
                       entry: Entry, pipeline: Pipeline, held: AbstractContextManager[Any],
                       sql: str, analysis: QueryAnalysis, targets: Sequence[CaptureTarget],
                       params: Sequence[object] | None) -> tuple[frozenset[int], ...] | None:
        """``pipeline``'s state for ``entry`` (query ``sql`` on ``targets``) built in conn's
        snapshot, its sketch checked against a capture there (:meth:`_cross_check`); None
        when it was refused (the entry then keeps recapture: ``ivm_off`` or an engine error,
        noted inside ``held``, the template's lock unless the caller holds it) or is left to
        another session (``RoundedFloats``: this one's)."""
        try:
            frags = pipeline.build_state(conn, self._seed(conn, analysis, targets, params,
                                                          pipeline))
        except NotMaintainable as exc:  # refused on the data (e.g. text ordering, collation)
            with held:
                self._note_too_large(tmpl, exc)
                entry.ivm_off = str(exc)
            return None
        except deltas.RoundedFloats:   # this session's; another's may build the state
            return None
        except ENGINE_BUGS as exc:
            with held:
                self._engine_bug(entry, exc)
            return None
        return self._cross_check(conn, entry, sql, analysis, list(targets), params, frags)

    def _build_later(self, conn: psycopg.Connection[Any], tmpl: Template, entry: Entry,
                     pipeline: Pipeline) -> bool:
        """Queues the build of ``entry``'s state (``pipeline``, compiled for it) for the
        background thread when its tables hold more than :data:`BUILD_IN_BACKGROUND` rows
        and PostgreSQL does not estimate its state at most :data:`GROUPS_INLINE` groups;
        True if queued. Why: a state build reads the whole query grouped per fragment and
        makes a few objects per group — 1M groups took 14 s, which the query that needed
        the state waited for (found: the first maintained query of a 1M-row table took 22 s,
        a recapture 1.5 s). Meanwhile its queries are answered by recapture."""
        row = conn.execute(_ROWS_UNDER, (list(entry.relations),)).fetchone()
        if row is None or float(row[0]) <= BUILD_IN_BACKGROUND:
            return False
        groups = pipeline.estimated_groups(conn)
        if groups is not None and groups <= GROUPS_INLINE:
            return False
        entry.building = True
        with self._lock:
            self._to_build.append((tmpl, entry, pipeline))
        self._count("state_builds_queued")
        self._ensure_background()
        return True

    def _recapture_in_place(self, conn: psycopg.Connection[Any], entry: Entry,
                            request: MaintenanceRequest) -> Sketch | None:
        """The sketch of an entry whose state is being built, kept or captured anew in
        conn's snapshot into the same entry (None: the capture failed; the entry goes).

        Why not a new entry, as a recapture otherwise makes: the queued build belongs to this
        one, and each write made another entry whose build was then queued too (found: a
        build of 14 s queued after every write, each thrown away)."""
        sketch = entry.sketch
        kept = self.maintenance.refresh(conn, sketch, request)
        if kept is not None or entry.analysis is None:
            return kept
        try:
            result = self.backend.capture(conn, sketch.query, entry.analysis,
                                          capture_targets(sketch), sketch.params)
        except CaptureError as exc:
            log.info("sketch %s: recapture failed (%s)", sketch.id, exc)
            return None
        entry.captures += 1
        self._count("captures")
        return _with_fragments(sketch, [r.fragments for r in result.parts], result.version)

    def take_build(self) -> tuple[Template, Entry, Pipeline] | None:
        """The oldest queued state build (:meth:`_build_later`), for the background thread."""
        with self._lock:
            return self._to_build.pop(0) if self._to_build else None

    def build_queued(self, conn: psycopg.Connection[Any], tmpl: Template, entry: Entry,
                     pipeline: Pipeline) -> None:
        """Builds a queued state on the background thread's connection (autocommit), in a
        REPEATABLE READ transaction of its own under the query's session settings, without
        the template's lock, and saves it (no query can use it yet, so no lock is needed:
        one taken to copy a 1M-group state made the template's queries wait for seconds);
        then gives it to the entry under the lock, if the entry still wants it: still held,
        without a pipeline, maintained incrementally and on the same targets (else the
        saved state is deleted again). The sketch is left as it is: the next query
        maintains the state from its version to the query's snapshot and takes the state's
        sketch then. The names are checked first in this snapshot, as eager maintenance does
        (the build evaluates the query's expressions as the service role)."""
        sketch, analysis, session = entry.sketch, entry.analysis, entry.session
        if analysis is None or session is None or sketch.id is None \
                or entry not in tmpl.entries or entry.ivm_off is not None:
            return   # dropped, evicted or recaptured since it was queued
        targets = capture_targets(sketch)
        started = time.perf_counter()
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            session.apply(conn)
            refused = names_refused(conn, entry)
            if refused is not None or not incremental.tracked(conn, pipeline):
                log.info("sketch %s: no state built (%s)", sketch.id, refused or "not tracked")
                return
            if self._build_checked(conn, tmpl, entry, pipeline, tmpl.lock, sketch.query,
                                   analysis, targets, sketch.params) is None:
                return
        built = time.perf_counter() - started
        saving = time.perf_counter()
        if self.settings.persist and sketch.id > 0:   # before anyone else can touch it
            with conn.transaction(), collector.paused():
                self.write_state(conn, str(sketch.id), pipeline.snapshot())
        saved = time.perf_counter() - saving
        with tmpl.lock:
            wanted = entry in tmpl.entries and entry.pipeline is None \
                and entry.ivm_off is None and capture_targets(entry.sketch) == targets \
                and self.kept_by_engine(entry)
            if wanted:
                entry.pipeline = pipeline
                entry.captures += 1
                entry.save_seconds, entry.saved_at = saved, time.monotonic()
                self._seconds["capture_seconds"] += built
                self._count("captures")
                self._count("state_builds")
        if not wanted:   # its saved state would hold the garbage collection back
            if self.settings.persist and sketch.id > 0:
                ivm_state.delete(conn, str(sketch.id), pipeline.version)
            return
        log.info("sketch %s: state built in the background at %s", sketch.id, pipeline.version)

    def _save_soon(self, conn: psycopg.Connection[Any], entry: Entry) -> None:
        """Persists a new state now, in the query's transaction, or — one of more than
        :data:`SAVE_IN_BACKGROUND` groups or rows — leaves it to the background thread.

        Why: a large state takes seconds to encode and write (1M groups: about 10 s), which
        the query that built it waited for. Until it is saved, the state is held back from
        garbage collection by its entry (the background collects below every live version)
        and a restart builds it anew."""
        pipeline = entry.pipeline
        if pipeline is not None and pipeline.held() > SAVE_IN_BACKGROUND:
            entry.dirty = True
            return
        self._save_state(conn, entry)

    def _seed(self, conn: psycopg.Connection[Any], analysis: QueryAnalysis,
              targets: Sequence[CaptureTarget], params: Sequence[object] | None,
              pipeline: Pipeline) -> AggregateState | None:
        """The aggregate state built by the heavy backend (Spark) when it takes the job, for
        ``Pipeline.build_state(conn, seed)``; None: the pipeline builds it in PostgreSQL (the
        backend logged and recorded why)."""
        spark_state = getattr(self.backend, "spark_state", None)
        if spark_state is None or pipeline.spec.kind != "aggregate":
            return None
        try:
            seed: AggregateState | None = spark_state(
                conn, state_analysis(analysis, pipeline.spec), targets, params,
                pipeline.spec.options.minmax_buffer)
        except BackendError as exc:  # e.g. a relation the backend cannot resolve
            log.info("aggregate state built in PostgreSQL: %s", exc)
            return None
        return seed

    def _maintain(self, conn: psycopg.Connection[Any], entry: Entry,
                  snapshot: str | None = None) -> Sketch | str | None:
        """``maintain`` in conn's snapshot (the caller holds the template lock).

        ``snapshot`` (see ``_refresh``) equal to the state's version: nothing committed
        between them (every write, TRUNCATE and DDL commits an xid, which changes the
        snapshot), so the state is exact for this query as it is — no delta read, no
        catch-up. A persisted state of another manager is no concern either: ours needs no
        audit row its garbage collection could have removed."""
        pipeline = entry.pipeline
        assert pipeline is not None
        if snapshot is not None and snapshot == pipeline.version and not pipeline.broken \
                and entry.sketch.version == pipeline.version:
            return entry.sketch
        started = time.perf_counter()
        try:
            self._catch_up_and_maintain(conn, entry, pipeline)
        except deltas.VersionAhead:
            self._count("version_ahead")
            return "the sketch's state is newer than the query's snapshot"
        except deltas.OwnWrites:
            return "the transaction wrote to a table of the query"
        except deltas.RoundedFloats as exc:
            return str(exc)
        except ENGINE_BUGS as exc:
            self._engine_bug(entry, exc)
            return None
        except (IvmError, deltas.NotTracked) as exc:
            log.info("sketch %s: recapture (%s: %s)", entry.sketch.id, type(exc).__name__, exc)
            self._count("ivm_failures")
            self.detach(entry)
            if isinstance(exc, NotMaintainable):  # e.g. values the engine cannot order
                entry.ivm_off = str(exc)
            return None
        self._note_maintenance(entry, time.perf_counter() - started)
        return entry.sketch

    def _engine_bug(self, entry: Entry, exc: Exception) -> None:
        """An unexpected failure inside the engine: this sketch falls back to recapture for
        good (always exact), loudly (``engine_errors`` in IMP SHOW STATS)."""
        log.error("sketch %s: incremental engine failed, recapture from now on: %r",
                  entry.sketch.id, exc, exc_info=exc)
        self._count("engine_errors")
        self.detach(entry)
        entry.ivm_off = f"engine error: {exc!r}"

    def _catch_up_and_maintain(self, conn: psycopg.Connection[Any], entry: Entry,
                               pipeline: Pipeline) -> None:
        """``pipeline.maintain(conn)``, first continuing from a newer persisted state of the
        sketch if another manager (a second proxy on this database) saved one: its garbage
        collection may have removed deltas ours still needs. That state is visible here, so
        it is not newer than this snapshot's view of the audit tables. A pipeline shared by
        several sketches cannot take one sketch's state: it breaks, and each of its sketches
        is captured anew.

        The saved version is read in the same round trip as the deltas (they are applied
        only when no newer state exists), not in one of its own before them.

        Why checking this sketch's own row suffices for a shared pipeline: every sketch on it
        persisted its row at a version the pipeline has reached, so the other manager's
        garbage collection passes that version only after it replaced all of those rows."""
        sid = entry.sketch.id
        if not self.settings.persist or sid is None or sid <= 0 or pipeline.version is None:
            pipeline.maintain(conn)
            return
        read = pipeline.read(conn, [incremental.stored_version_statement(str(sid))])
        stored = incremental.stored_version_of(read.also[0])
        if stored is None or deltas.Snapshot.parse(stored).within(
                deltas.Snapshot.parse(pipeline.version)):
            pipeline.apply(conn, read)
            return
        if pipeline.heads:
            pipeline.broken = True
            raise PipelineBroken(f"a newer persisted state of sketch {sid}: the state it "
                                 "shares with other sketches is rebuilt")
        log.info("sketch %s: a newer persisted state (%s) replaces ours (%s)", sid, stored,
                 pipeline.version)
        if not ivm_state.load(conn, str(sid), pipeline):
            raise PipelineBroken("the persisted state disappeared or is of an earlier epoch")
        self._count("states_loaded")
        pipeline.maintain(conn)

    def _note_maintenance(self, entry: Entry, seconds: float) -> None:
        pipeline = entry.pipeline
        assert pipeline is not None
        self._seconds["maintenance_seconds"] += seconds
        if pipeline.applied:
            entry.maintenances += 1
            entry.last_maintained = time.monotonic()
            self._count("maintenances")
        if pipeline.refilled:
            self._count("refills", pipeline.refilled)
        if pipeline.version != entry.sketch.version:
            entry.dirty = True
            self._apply(entry, pipeline.sketch(entry.head), pipeline.version or "")

    def _apply(self, entry: Entry, frags: Sequence[frozenset[int]], version: str) -> None:
        """The entry's sketch with the pipeline's fragments at ``version``."""
        old = entry.sketch
        entry.sketch = _with_fragments(old, frags, version)
        if entry.sketch.parts != old.parts:
            entry.instrumented.clear()

    def _save_state(self, conn: psycopg.Connection[Any], entry: Entry) -> None:
        """Persists the entry's state in conn's transaction (the caller holds its lock)."""
        with collector.paused():
            pending = self.state_to_save(entry)
            if pending is not None:
                self.write_state(conn, *pending)
                del pending

    def state_to_save(self, entry: Entry) -> tuple[str, dict[str, Json]] | None:
        """The entry's key and state to persist (the caller holds its lock), marked saved;
        None when it is not persisted. :meth:`write_state` writes it, also after the lock is
        released: encoding and writing a large state takes seconds, during which queries of
        its template would wait."""
        sid, pipeline = entry.sketch.id, entry.pipeline
        if not self.settings.persist or pipeline is None or sid is None or sid <= 0 \
                or pipeline.version is None:
            return None
        entry.dirty = False
        return str(sid), pipeline.snapshot(entry.head)

    def write_state(self, conn: psycopg.Connection[Any], key: str,
                    snap: dict[str, Json]) -> None:
        """Writes a state of :meth:`state_to_save` in conn's transaction, unless another
        manager's newer state is stored (it stays; ours catches up on its next use)."""
        stored = incremental.stored_version(conn, key)
        if stored is not None and not deltas.Snapshot.parse(stored).within(
                deltas.Snapshot.parse(str(snap["version"]))):
            return
        ivm_state.write(conn, key, snap)
        self._remember_own_xid(conn)

    def worth_saving(self, conn: psycopg.Connection[Any], entry: Entry) -> bool:
        """Should the background save this changed state now (the caller holds its lock)?
        Yes when it was never saved, or when audit rows newer than the saved version exist:
        that version holds back their garbage collection (a restart would read them again).

        Why not every change of version: a version moves in every new snapshot, with or
        without a delta, and saving commits — which starts a new snapshot, in which the next
        query moves the version again. Without this check a proxy nobody writes through kept
        saving every state each ``state_interval``, and each save made every answer kept in
        memory miss. A saved state stays exact at its own version, so skipping costs nothing
        but its age."""
        sid, pipeline = entry.sketch.id, entry.pipeline
        if sid is None or sid <= 0 or pipeline is None:
            return False
        stored = incremental.stored_version(conn, str(sid))
        if stored is None:
            return True
        for relid in pipeline.relids:
            try:
                info = deltas.table_info(conn, relid)
            except deltas.NotTracked:
                return False  # the state is invalid: its next use rebuilds it
            if deltas.any_since(conn, info, stored):
                return True
        return False

    def give_up_state(self, entry: Entry) -> None:
        """Detaches ``entry`` (now kept by recapture) and queues the deletion of its saved
        state for the background (:meth:`delete_given_up`; the caller holds the template's
        lock). Why: the saved state held the audit-row collection back until the sketch was
        evicted (found by a helper's search in session 28: 464 rows kept after a strategy
        switch)."""
        self.detach(entry)
        if entry.sketch.id is not None and entry.sketch.id > 0:
            with self._lock:
                self._unsaved.add(entry.sketch.id)

    def delete_given_up(self, conn: psycopg.Connection[Any]) -> None:
        """Deletes the saved states :meth:`give_up_state` queued, of sketches still without
        a state (on the background's autocommit connection)."""
        with self._lock:
            queued, self._unsaved = self._unsaved, set()
        stateless = {e.sketch.id for _t, e in self.entries() if e.pipeline is None}
        gone = sorted(queued & stateless)
        if gone and self.settings.persist and incremental.installed(conn):
            with conn.transaction():
                for sid in gone:
                    ivm_state.delete(conn, str(sid))

    def detach(self, entry: Entry) -> None:
        """The entry keeps no pipeline (a shared one stops maintaining its head)."""
        if entry.head is not None and entry.pipeline is not None:
            entry.pipeline.drop_head(entry.head)
        entry.pipeline = None
        entry.head = None

    def _share(self, conn: psycopg.Connection[Any], tmpl: Template, entry: Entry,
               pipeline: Pipeline) -> tuple[frozenset[int], ...] | None:
        """Gives ``entry`` (a capture, or a sketch without a pipeline yet) a head on the
        pipeline of a sketch of its template on the same relations (the same text names other
        tables under another search_path) that differs only in HAVING, or only in the k of
        a top-k over groups (``Pipeline.shares_with``), brought to this
        snapshot: one aggregation maintained for both, and no build of a state. Returns the
        head's sketch, None when no pipeline can be shared (then ``pipeline``, compiled for
        the entry, gets its own state)."""
        if not self.settings.share_state:
            return None
        for other in tmpl.entries:
            shared = other.pipeline
            if shared is None or other.relations != entry.relations \
                    or not shared.shares_with(pipeline.spec) \
                    or not self.kept_by_engine(other):
                continue
            if not isinstance(self._maintain(conn, other), Sketch):
                continue
            if other.pipeline is not shared or not shared.shares_with(pipeline.spec):
                continue
            try:
                entry.head = shared.add_head(pipeline.spec)
            except NotMaintainable as exc:   # this entry's HAVING, say: its own build decides
                log.info("sketch %s: no shared state (%s)", entry.sketch.id, exc)
                return None
            entry.pipeline = shared
            self._count("shared_states")
            return shared.sketch(entry.head)
        return None

    def _refuse_too_large(self, tmpl: Template | None) -> None:
        """Raises :class:`StateTooLarge` when a build of the template gave up under the
        ``max_state_rows`` in force or a higher one (found by a regression search in session
        26: every recapture ran the whole refused build query again)."""
        if tmpl is not None and tmpl.too_large and self.settings.max_state_rows <= tmpl.too_large:
            raise StateTooLarge(f"a state of more than {tmpl.too_large:,} rows (max_state_rows)")

    def _note_too_large(self, tmpl: Template | None, exc: Exception) -> None:
        if tmpl is not None and isinstance(exc, StateTooLarge):
            tmpl.too_large = self.settings.max_state_rows

    def _compile(self, conn: psycopg.Connection[Any], analysis: QueryAnalysis,
                 targets: Sequence[SketchTarget], params: Sequence[object] | None) -> Pipeline:
        """:func:`incremental.compile_checked`, its state builds bounded by the
        ``max_state_rows`` setting."""
        pipeline = incremental.compile_checked(conn, analysis, targets, params)
        pipeline.max_rows = self.settings.max_state_rows
        return pipeline

    def _queue_tracking(self, pipeline: Pipeline, session: incremental.SessionSettings) -> None:
        with self._lock:
            for rel in incremental.relations(pipeline):
                self._to_track.setdefault(rel, session)
        self._ensure_background()

    def _remember_conninfo(self, conn: psycopg.Connection[Any]) -> None:
        """Connection parameters for the background thread's own connection."""
        params: dict[str, Any] = dict(conn.info.get_parameters())
        if conn.info.password:
            params["password"] = conn.info.password
        self._conninfo = params

    def _ensure_background(self) -> None:
        from sketches.background import Background

        with self._lock:
            if self._background is None and self._conninfo is not None:
                self._background = Background(self, self._conninfo)
                self._background.start()

    def close(self) -> None:
        """Stops the background thread (persisting what it can first)."""
        with self._lock:
            bg, self._background = self._background, None
        if bg is not None:
            bg.stop()

    def background_ended(self, thread: object) -> None:
        """The background thread gave up (its database is gone or unreachable)."""
        with self._lock:
            if self._background is thread:
                self._background = None

    def set_strategy(self, sketch_id: int, strategy: str | None) -> bool:
        """Per-sketch strategy (None: follow ``SketchSettings.strategy``)."""
        value = None if strategy is None else incremental.check_strategy(strategy)
        for tmpl, entry in self.entries():
            if entry.sketch.id == sketch_id:
                with tmpl.lock:
                    entry.strategy = value
                    if value == "recapture":
                        self.give_up_state(entry)
                if value == "eager":
                    self._ensure_background()
                return True
        return False

    def configure(self, name: str, value: str) -> None:
        """``IMP SET <name> = <value>``: a SketchSettings field, process-wide (KeyError:
        unknown name, ValueError: bad value). ``strategy`` also applies to every sketch without
        a per-sketch strategy."""
        fields = {f.name: f for f in dataclasses.fields(self.settings)}
        if name not in fields:
            raise KeyError(name)
        current = getattr(self.settings, name)
        raw = value.strip()
        parsed: Any
        if isinstance(current, bool):
            if raw.lower() not in ("on", "off", "true", "false", "1", "0", "yes", "no"):
                raise ValueError(f"not a boolean: {value!r}")
            parsed = raw.lower() in ("on", "true", "1", "yes")
        elif isinstance(current, int):
            parsed = int(raw)
        elif isinstance(current, float):
            parsed = float(raw)
        else:
            parsed = raw.lower()
        self.settings = dataclasses.replace(self.settings, **{name: parsed})
        if self.settings.strategy == "eager":
            self._ensure_background()

    def entries(self) -> list[tuple[Template, Entry]]:
        """Every (template, entry) held, for the background thread."""
        with self._lock:
            return [(t, e) for t in self._templates.values() for e in t.entries]

    def take_tracking(self) -> dict[str, incremental.SessionSettings]:
        with self._lock:
            out, self._to_track = self._to_track, {}
        return out
