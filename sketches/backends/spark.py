"""The Spark execution backend — the only module that imports pyspark (lazily, inside
functions: the proxy runs without pyspark installed).

Runtime. One long-lived :class:`SparkRuntime` holds the process's SparkSession. It is started
in a background thread (:meth:`SparkRuntime.start`), never on a client's request path (a
session takes 4.5–6 s to start, DESIGN §9); until it is ready every job raises
:class:`BackendUnavailable` and the router runs PostgreSQL instead. The JDBC driver comes from
``jdbc_jar`` (Debian's ``libpostgresql-jdbc-java``: ``/usr/share/java/postgresql.jar``); it is
never downloaded. ``master`` and any ``spark.*`` setting come from :class:`SparkSettings`.

Jobs. :func:`sketches.backends.plan.build_plan` splits the query into pushed-down PostgreSQL
reads (filters, per-row expressions and the fragment id evaluated by PostgreSQL) and the part
Spark computes with identical semantics (equi-joins, grouping, count/sum/min/max, HAVING and
ORDER BY … LIMIT with ties over numbers). Every read is a JDBC query split into at most
``max_partitions`` partitions by predicates over contiguous runs of the range partition of the
sketch attribute (``a >= lo AND a < hi``; NULLs with the last run), so text and date attributes
partition as well as integers. Every JDBC connection first runs ``BEGIN ISOLATION LEVEL
REPEATABLE READ; SET TRANSACTION SNAPSHOT '<id>'`` with a snapshot exported from the caller's
connection, and takes the caller's search_path, TimeZone, DateStyle and IntervalStyle
(:data:`JDBC_SETTINGS`): Spark reads exactly the data the caller's transaction sees, filtered
as the caller reads its constants, and the sketch's version is that snapshot.

Values that come back to Python (state building, ΔR⋈S') are those PostgreSQL computed, except
aggregates: ``sum`` is converted to PostgreSQL's result type (``sum(int8)`` is numeric).
Columns of types whose Spark mapping is not value-exact (``real``, unconstrained ``numeric`` or
beyond ``numeric(38, 38)``, ``timestamptz``, …) are refused, and a job reading a date or
timestamp before 1582-10-15 (or infinite) fails (:func:`_guarded_query`); the JVMs run in UTC
(:data:`JVM_OPTIONS`). ``float8`` sums may differ in the last bits from PostgreSQL's
(summation order), as they do between two PostgreSQL plans.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from decimal import Decimal
from functools import reduce
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from sketches.backends.base import (
    AggregateState,
    BackendJobFailed,
    BackendUnavailable,
    BackendUnsupported,
    FullMaintenance,
    MatchRequest,
    PartialRow,
    Row,
    ValueRow,
)
from sketches.backends.plan import (
    ARITHMETIC,
    BatchPlan,
    Bin,
    BoolOp,
    IsNull,
    Lit,
    Neg,
    Node,
    Not,
    OrderKey,
    Ref,
    TableRead,
    build_plan,
)
from sketches.backends.postgres import resolve_schemas, snapshot_transaction
from sketches.capture import CaptureResult, CaptureTarget
from sketches.sketch import SketchPart
from sketches.sql.model import QueryAnalysis
from sketches.typeoids import (
    BOOL,
    DATE,
    FLOAT8,
    INT2,
    INT4,
    INT8,
    NUMERIC,
    TEXT,
    TIMESTAMP,
    VARCHAR,
)

log = logging.getLogger(__name__)

DEFAULT_JAR = "/usr/share/java/postgresql.jar"
DEFAULT_CONF: tuple[tuple[str, str], ...] = (
    ("spark.sql.shuffle.partitions", "4"),
    ("spark.ui.enabled", "false"),
    ("spark.sql.session.timeZone", "UTC"),
    ("spark.sql.ansi.enabled", "true"),
    ("spark.sql.decimalOperations.allowPrecisionLoss", "false"),
    ("spark.driver.memory", "1g"),
    ("spark.ui.showConsoleProgress", "false"),
)

# PostgreSQL type oids whose values survive the JDBC → Spark → Python trip unchanged.
_EXACT_TYPES = frozenset({BOOL, INT8, INT2, INT4, TEXT, FLOAT8, VARCHAR, DATE, TIMESTAMP,
                          NUMERIC})  # not char(n): Spark's read-side padding
_MAX_DECIMAL = 38   # Spark's largest decimal precision and scale
_DATETIMES = frozenset({DATE, TIMESTAMP})
_C_COLLATIONS = frozenset({"C", "POSIX", "C.UTF-8", "C.utf8"})
_CODE_POINT_ORDERED = frozenset({"UTF8", "LATIN1"})   # encodings whose bytes sort as code points
_TEXTS = frozenset({TEXT, VARCHAR})   # the collatable types Spark reads (not char(n))


JDBC_SETTINGS = ("search_path", "TimeZone", "DateStyle", "IntervalStyle")
"""Settings the JDBC connections take from the caller's transaction (``SET LOCAL``): their
pushed-down filters must read constants as the caller does (pgjdbc starts with the JVM's
TimeZone and DateStyle ISO; a date compared with ``'…+00'::timestamptz`` or with
``'03/01/2020'`` depends on them). Found: a capture through Spark missed two of four
fragments for a caller in Pacific/Kiritimati."""


_RULES = "org.apache.spark.sql.catalyst.optimizer."
_EXCLUDED_KEY = "spark.sql.optimizer.excludedRules"
EXCLUDED_RULES = tuple(_RULES + name for name in (
    "UnwrapCastInBinaryComparison", "ReorderAssociativeOperator", "SimplifyBinaryComparison",
    "NullPropagation", "BooleanSimplification"))
"""Catalyst optimizer rules the session excludes (``spark.sql.optimizer.excludedRules``,
added to any configured ones): each decides an expression without evaluating an operand
that fails, where PostgreSQL evaluates it for every group and raises. Found: ``HAVING max(s)
* max(s) > 80000`` (smallint: 22003 in PostgreSQL) became ``false`` — a smallint compared
with a constant beyond its range (UnwrapCastInBinaryComparison) — so the capture succeeded
with an empty sketch and the query answered no rows instead of failing. Likewise ``max(v) +
2147483000 + -2147483000`` became ``max(v) + 0`` (ReorderAssociativeOperator), ``x = x``
and ``x IS NULL`` of a non-nullable ``x`` (``count(*) * 9223372036854775807``) were decided
without ``x`` (SimplifyBinaryComparison, NullPropagation), and so was ``x AND NOT x``
(BooleanSimplification). :func:`_check_optimizer` verifies the exclusion at start."""


JVM_OPTIONS = "-Duser.timezone=UTC"
"""Java options of the driver and executor JVMs: pgjdbc's ``getTimestamp`` builds a
``java.sql.Timestamp`` in the JVM's default TimeZone, so a timestamp in a DST gap of the
host's zone (``2021-03-14 02:45`` in America/New_York) was read an hour later and ordered
after ``03:40`` (found); UTC has no gaps. Set before the JVM starts (``spark.*``
``extraJavaOptions``); :func:`_create_session` checks that it took effect."""


def _for_jdbc(name: str, value: object) -> str:
    """``value`` of setting ``name`` as a JDBC connection may take it: pgjdbc refuses a
    DateStyle whose output style is not ISO, and only the field order (``DMY``…) changes
    how input is read."""
    text = str(value)
    if name == "DateStyle":   # PostgreSQL shows both parts: "SQL, DMY"
        order = text.partition(",")[2].strip()
        return f"ISO, {order}" if order else "ISO"
    return text


@dataclass(frozen=True, slots=True)
class SparkSettings:
    """``master``: a Spark master URL (``local[*]``, ``spark://host:7077``, ``yarn``…);
    ``conf``: any ``spark.*`` settings (override :data:`DEFAULT_CONF`; never the
    :data:`JVM_OPTIONS` and :data:`EXCLUDED_RULES`, which are added); ``jdbc_jar``: the
    PostgreSQL JDBC driver; ``jdbc_url``: how executors reach PostgreSQL (default: built from
    the caller's connection — host, port, database, user; the password travels as a
    property); ``max_partitions``: JDBC partitions per table read; ``broadcast_rows``: in a
    join, tables PostgreSQL estimates (``reltuples``) at most this large are broadcast (JDBC
    relations have no size statistics in Spark, which would otherwise shuffle both sides)."""

    master: str = "local[*]"
    app_name: str = "imp-proxy"
    conf: tuple[tuple[str, str], ...] = ()
    jdbc_jar: str = DEFAULT_JAR
    jdbc_url: str | None = None
    max_partitions: int = 8
    fetch_size: int = 10_000
    broadcast_rows: float = 1_000_000.0

    def spark_conf(self) -> dict[str, str]:
        """The session's settings; the JVMs always run with :data:`JVM_OPTIONS` added to
        any configured ``extraJavaOptions``."""
        out = dict(DEFAULT_CONF)
        out.update(self.conf)
        out["spark.jars"] = self.jdbc_jar
        out.setdefault("spark.driver.extraClassPath", self.jdbc_jar)
        for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
            out[key] = f"{out.get(key, '')} {JVM_OPTIONS}".strip()
        configured = [r.strip() for r in out.get(_EXCLUDED_KEY, "").split(",") if r.strip()]
        out[_EXCLUDED_KEY] = ",".join(
            configured + [r for r in EXCLUDED_RULES if r not in configured])
        return out

    @classmethod
    def from_sources(cls, env: Mapping[str, str] | None = None,
                     table: Mapping[str, Any] | None = None) -> SparkSettings:
        """Settings from a TOML table (``master``, ``jdbc_jar``, ``jdbc_url``,
        ``max_partitions`` and any ``spark.*`` key) overridden by the environment:
        ``IMP_SPARK_MASTER``, ``IMP_SPARK_CONF`` (a JSON object of ``spark.*`` settings),
        ``IMP_SPARK_JDBC_JAR``, ``IMP_SPARK_JDBC_URL``."""
        env = os.environ if env is None else env
        table = table or {}
        conf = {str(k): str(v) for k, v in table.items() if str(k).startswith("spark.")}
        if isinstance(table.get("conf"), Mapping):
            conf.update({str(k): str(v) for k, v in table["conf"].items()})
        raw = env.get("IMP_SPARK_CONF")
        if raw:
            try:
                extra = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ValueError(f"IMP_SPARK_CONF is not JSON: {exc}") from exc
            if not isinstance(extra, dict):
                raise ValueError("IMP_SPARK_CONF must be a JSON object")
            conf.update({str(k): str(v) for k, v in extra.items()})
        bad = [k for k in conf if not k.startswith("spark.")]
        if bad:
            raise ValueError(f"not spark.* settings: {bad}")
        out = cls(conf=tuple(sorted(conf.items())))
        master = env.get("IMP_SPARK_MASTER") or table.get("master")
        jar = env.get("IMP_SPARK_JDBC_JAR") or table.get("jdbc_jar")
        url = env.get("IMP_SPARK_JDBC_URL") or table.get("jdbc_url")
        parts = table.get("max_partitions")
        return replace(out, master=str(master or out.master), jdbc_jar=str(jar or out.jdbc_jar),
                       jdbc_url=str(url) if url else None,
                       max_partitions=int(parts) if parts else out.max_partitions)


@dataclass
class SparkRuntime:
    """The process's long-lived SparkSession, started off the request path."""

    settings: SparkSettings = field(default_factory=SparkSettings)
    state: str = "stopped"  # stopped | starting | ready | failed
    reason: str = "not started"
    started_seconds: float | None = None
    _session: Any = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ready: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        """Starts the session in a background thread (no-op when already started)."""
        with self._lock:
            if self.state != "stopped":
                return
            self.state, self.reason = "starting", "SparkSession starting"
            self._thread = threading.Thread(target=self._start, name="imp-spark-warmup",
                                            daemon=True)
            self._thread.start()

    def _start(self) -> None:
        began = time.perf_counter()
        try:
            session = _create_session(self.settings)
        except BackendUnavailable as exc:
            self._fail(str(exc))
            return
        except Exception as exc:  # noqa: BLE001 — any JVM/py4j failure means "unavailable"
            self._fail(f"SparkSession failed to start: {type(exc).__name__}: "
                       f"{str(exc).splitlines()[0] if str(exc) else ''}")
            return
        with self._lock:
            self._session = session
            self.started_seconds = time.perf_counter() - began
            self.state, self.reason = "ready", (
                f"SparkSession {self.settings.master} ready in {self.started_seconds:.1f} s")
        log.info("%s", self.reason)
        self._ready.set()

    def _fail(self, reason: str) -> None:
        with self._lock:
            self.state, self.reason = "failed", reason
        log.warning("Spark unavailable: %s", reason)
        self._ready.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the start finished (for tests, benchmarks and the CLI, never the
        request path); True when the session is ready."""
        self._ready.wait(timeout)
        return self.state == "ready"

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def session(self) -> Any:
        """The SparkSession; BackendUnavailable (with the reason) unless ready."""
        with self._lock:
            if self.state != "ready":
                raise BackendUnavailable(self.reason)
            return self._session

    def stop(self) -> None:
        with self._lock:
            session, self._session = self._session, None
            self.state, self.reason = "stopped", "stopped"
            self._ready.clear()
        if session is not None:
            session.stop()


def _create_session(settings: SparkSettings) -> Any:
    if not Path(settings.jdbc_jar).is_file():
        raise BackendUnavailable(
            f"PostgreSQL JDBC driver not found at {settings.jdbc_jar} (install Debian's "
            "libpostgresql-jdbc-java or configure jdbc_jar; it is never downloaded)")
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise BackendUnavailable(f"pyspark is not installed ({exc}); pip install "
                                 "'imp-proxy[spark]'") from exc
    builder = SparkSession.builder.master(settings.master).appName(settings.app_name)
    for key, value in settings.spark_conf().items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    actual = session.sparkContext.master
    if actual != settings.master:
        log.warning("a SparkSession with master %s already existed (wanted %s)", actual,
                    settings.master)
    session.sparkContext.setLogLevel("ERROR")
    _check_jvm_time_zone(session)
    _warm_up(session)
    _check_optimizer(session)
    return session


def _check_jvm_time_zone(session: Any) -> None:
    """BackendUnavailable unless the driver JVM's default TimeZone is UTC (see
    :data:`JVM_OPTIONS`; a session created earlier in the process keeps its own JVM)."""
    zones = session.sparkContext._jvm.java.util.TimeZone
    default = zones.getDefault()
    if not default.hasSameRules(zones.getTimeZone("UTC")):
        zone = default.getID()
        session.stop()
        raise BackendUnavailable(f"the Spark driver JVM runs in TimeZone {zone}, not UTC "
                                 f"({JVM_OPTIONS} was not applied): pgjdbc would shift "
                                 "timestamps in its DST gaps")


def _warm_up(session: Any) -> None:
    """A first tiny job (JIT, executors, shuffle) and a check that the JDBC driver loads, so
    neither is paid by — or fails in — the first real job."""
    session.range(0, 10_000, numPartitions=2).selectExpr("id % 7 AS k").groupBy("k").count() \
        .collect()
    try:
        session.sparkContext._jvm.java.lang.Class.forName("org.postgresql.Driver")
    except Exception as exc:  # noqa: BLE001 — py4j wraps the JVM's ClassNotFoundException
        session.stop()
        raise BackendUnavailable(f"PostgreSQL JDBC driver does not load from "
                                 f"{session.conf.get('spark.jars', '?')}: "
                                 f"{_first_line(exc)}") from exc


def _check_optimizer(session: Any) -> None:
    """BackendUnavailable unless an overflow compared with a constant beyond its type still
    fails the job (``smallint * smallint > 80000``): Catalyst decides that comparison
    without the product unless :data:`EXCLUDED_RULES` took effect, and a Spark version that
    renamed a rule or made it non-excludable only logs a warning."""
    probe = session.range(1, 2).selectExpr("CAST(id + 299 AS smallint) AS s") \
        .where("s * s > 80000")
    try:
        rows = probe.collect()
    except Exception as exc:  # noqa: BLE001 — py4j wraps the JVM's SparkArithmeticException
        if "OVERFLOW" in str(exc).upper():
            return
        reason = f"Spark's optimizer check failed: {_first_line(exc)}"
    else:
        excluded = session.conf.get(_EXCLUDED_KEY, "")
        reason = (f"Spark decided an overflowing comparison without evaluating it ({len(rows)}"
                  f" rows, no error): {_EXCLUDED_KEY}={excluded!r} did not take effect")
    session.stop()
    raise BackendUnavailable(reason)


# ------------------------------------------------------------------------- the backend


class SparkBackend:
    """Heavy operations as Spark jobs over JDBC reads of PostgreSQL (see the module docs)."""

    name = "spark"

    def __init__(self, runtime: SparkRuntime, settings: SparkSettings | None = None) -> None:
        """``settings`` overrides the runtime's job settings (JDBC URL, partitions); the
        session-level ones (master, ``spark.*``) are the runtime's."""
        self.runtime = runtime
        self.settings = settings or runtime.settings

    # -- public operations --------------------------------------------------------------

    def capture(self, conn: psycopg.Connection[Any], sql_text: str, analysis: QueryAnalysis,
                targets: Sequence[CaptureTarget],
                params: Sequence[object] | None = None) -> CaptureResult:
        spark = self.runtime.session()
        started = time.perf_counter()
        plan, c_collation = self._plan(conn, analysis, targets, params)
        with self._snapshot(conn) as (init, version):
            frames = self._frames(spark, conn, plan, init, {})
            fragments = self._capture_job(plan, frames, c_collation)
        seconds = time.perf_counter() - started
        parts = tuple(SketchPart(t.table, t.schema, t.column, t.partition,
                                 frozenset(fragments[i]), t.nullable)
                      for i, t in enumerate(targets))
        log.debug("spark capture %s in %.1f ms", [len(p.fragments) for p in parts],
                  seconds * 1e3)
        return CaptureResult(version, parts, seconds, f"spark job over {len(plan.reads)} "
                             f"JDBC read(s) at {self.settings.master}")

    def build_state(self, conn: psycopg.Connection[Any], analysis: QueryAnalysis,
                    targets: Sequence[CaptureTarget], params: Sequence[object] | None = None,
                    buffer_limit: int | None = None) -> AggregateState:
        spark = self.runtime.session()
        started = time.perf_counter()
        plan, c_collation = self._plan(conn, analysis, targets, params)
        if not plan.grouped:
            raise BackendUnsupported("no aggregation or DISTINCT: no aggregate state to build")
        types: dict[str, int] = {}
        with self._snapshot(conn) as (init, version):
            frames = self._frames(spark, conn, plan, init, types)
            _check_text_extremes(plan, types, c_collation)
            partials, values, truncated = self._state_job(plan, frames, buffer_limit, types)
        return AggregateState.build(version, [a.function for a in plan.aggregates],
                                    plan.slots, partials, values, truncated, self.name,
                                    time.perf_counter() - started)

    def full_maintenance(self, conn: psycopg.Connection[Any], sql_text: str,
                         analysis: QueryAnalysis, targets: Sequence[CaptureTarget],
                         params: Sequence[object] | None = None,
                         buffer_limit: int | None = None) -> FullMaintenance:
        spark = self.runtime.session()
        started = time.perf_counter()
        plan, c_collation = self._plan(conn, analysis, targets, params)
        if not plan.grouped:
            raise BackendUnsupported("no aggregation or DISTINCT: no aggregate state to build")
        types: dict[str, int] = {}
        with self._snapshot(conn) as (init, version):
            frames = self._frames(spark, conn, plan, init, types)
            _check_text_extremes(plan, types, c_collation)
            fragments = self._capture_job(plan, frames, c_collation)
            mid = time.perf_counter()
            partials, values, truncated = self._state_job(plan, frames, buffer_limit, types)
        end = time.perf_counter()
        parts = tuple(SketchPart(t.table, t.schema, t.column, t.partition,
                                 frozenset(fragments[i]), t.nullable)
                      for i, t in enumerate(targets))
        state = AggregateState.build(version, [a.function for a in plan.aggregates],
                                     plan.slots, partials, values, truncated, self.name,
                                     end - mid)
        return FullMaintenance(CaptureResult(version, parts, mid - started, "spark"), state)

    def match_rows(self, conn: psycopg.Connection[Any], request: MatchRequest,
                   keys: Collection[Row]) -> list[Row]:
        """The rows whose key columns equal one of ``keys``, matched in Spark. Refused for a
        nondeterministic collation, where PostgreSQL matches ``'a'`` with ``'A'`` (found:
        10 rows instead of 20); a deterministic one's equality is Spark's byte equality."""
        distinct = sorted({tuple(k) for k in keys if all(v is not None for v in k)}, key=repr)
        if not distinct:
            return []
        spark = self.runtime.session()
        outputs = tuple((f"c{i}", sql.Identifier("s", c).as_string(conn))
                        for i, c in enumerate(request.columns))
        key_outputs = tuple((f"k{i}", sql.Identifier("s", c).as_string(conn))
                            for i, c in enumerate(request.key_columns))
        read = TableRead(0, request.schema, request.table, "s", outputs + key_outputs, (),
                         None if request.target is None else 0, request.target)
        plan = BatchPlan((read,), (), False, (), (), None, (), None,
                         0 if request.target is None else 1)
        self._c_like(conn, plan.reads)
        with self._snapshot(conn) as (init, _version):
            (frame,) = self._frames(spark, conn, plan, init, {})
            from pyspark.sql import functions as F
            from pyspark.sql.types import StructType
            schema = StructType([frame.schema[name] for name, _ in key_outputs])
            keys_df = spark.createDataFrame(distinct, schema=schema)
            keys_df = keys_df.toDF(*[f"q{i}" for i in range(len(key_outputs))])
            cond = reduce(lambda a, b: a & b, [
                frame[name] == keys_df[f"q{i}"] for i, (name, _) in enumerate(key_outputs)])
            cols = [name for name, _ in outputs]
            if request.target is not None:
                cols.append(str(read.fragment_column))
            joined = frame.join(F.broadcast(keys_df), cond, "inner").select(*cols)
            rows = self._collect(joined)
        return [tuple(r) for r in rows]

    # -- planning and reading ------------------------------------------------------------

    def _plan(self, conn: psycopg.Connection[Any], analysis: QueryAnalysis,
              targets: Sequence[CaptureTarget],
              params: Sequence[object] | None) -> tuple[BatchPlan, bool]:
        """The batch plan and whether every text value read compares as in C (Spark compares
        code points): the database's collation and the read columns' own. Raises
        :class:`BackendUnsupported` for a column under a nondeterministic collation, where
        PostgreSQL groups, joins and deduplicates ``'a'`` with ``'A'`` and Spark does not.
        (Found: such a group key got an empty sketch, PostgreSQL's has every fragment; an
        ``"en-x-icu"`` column ordered by code points in a C database kept another top-k.)"""
        schemas = resolve_schemas(conn, analysis, targets)
        plan = build_plan(conn, analysis, targets, params, schemas)
        return plan, self._c_like(conn, plan.reads)

    def _c_like(self, conn: psycopg.Connection[Any], reads: Sequence[TableRead]) -> bool:
        """Whether every text value ``reads`` return compares as in C; BackendUnsupported
        for a nondeterministic collation (see :meth:`_plan`).

        C compares the database encoding's bytes, Spark code points: the same order only in
        an encoding whose byte order is code point order (found: a WIN1252 database, where
        ``€`` is 0x80 below ``é`` 0xE9, kept another top-k in Spark)."""
        row = conn.execute("SELECT datcollate, pg_encoding_to_char(encoding) FROM pg_database"
                           " WHERE datname = current_database()").fetchone()
        bytewise = row is not None and str(row[1]) in _CODE_POINT_ORDERED
        c_database = bytewise and row is not None and str(row[0]) in _C_COLLATIONS
        c_like = c_database
        for read in reads:
            for name, deterministic in self._collations(conn, read):
                if not deterministic:
                    raise BackendUnsupported(f"a column of {read.schema}.{read.name} has the "
                                             f"nondeterministic collation {name}")
                c_like = c_like and (name in _C_COLLATIONS or name == "ucs_basic"
                                     or (name == "default" and c_database))
        return c_like

    def _collations(self, conn: psycopg.Connection[Any],
                    read: TableRead) -> list[tuple[str, bool]]:
        """``(name, deterministic)`` of the collation of each text value ``read`` returns
        (planned, never run)."""
        text = [n for n, t in self._read_types(conn, read).items() if t in _TEXTS]
        if not text:
            return []
        query = sql.SQL(
            "SELECT c.collname, c.collisdeterministic FROM (SELECT) AS imp_one"
            " LEFT JOIN ({}) AS q ON false, unnest(ARRAY[{}]) AS n(name)"
            " JOIN pg_catalog.pg_collation AS c ON c.oid = n.name::regcollation"
        ).format(read.query(), sql.SQL(", ").join(
            sql.SQL("pg_catalog.pg_collation_for(q.{})").format(sql.Identifier(n))
            for n in text))
        with _pushed_down(conn, read):
            return [(str(r[0]), bool(r[1])) for r in conn.execute(query).fetchall()]

    @contextmanager
    def _snapshot(self, conn: psycopg.Connection[Any]) -> Iterator[tuple[str, str]]:
        """``(session init statement, version)``: the caller's snapshot exported for the
        JDBC connections, with the caller's :data:`JDBC_SETTINGS`; the caller's transaction
        stays open while Spark reads."""
        with snapshot_transaction(conn):
            row = conn.execute(sql.SQL(
                "SELECT pg_export_snapshot(), pg_current_snapshot()::text, {}").format(
                    sql.SQL(", ").join(sql.SQL("current_setting({})").format(sql.Literal(n))
                                       for n in JDBC_SETTINGS))).fetchone()
            assert row is not None
            init = sql.SQL("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; "
                           "SET TRANSACTION SNAPSHOT {}; SELECT {}").format(
                sql.Literal(str(row[0])), sql.SQL(", ").join(
                    sql.SQL("set_config({}, {}, true)").format(sql.Literal(n),
                                                               sql.Literal(_for_jdbc(n, v)))
                    for n, v in zip(JDBC_SETTINGS, row[2:], strict=True)))
            yield init.as_string(conn), str(row[1])

    def _jdbc(self, conn: psycopg.Connection[Any]) -> tuple[str, dict[str, str]]:
        info = conn.info
        props = {"user": info.user, "driver": "org.postgresql.Driver"}
        if info.password:
            props["password"] = info.password
        if self.settings.jdbc_url:
            return self.settings.jdbc_url, props
        host = info.host
        if not host or host.startswith("/"):
            raise BackendUnavailable("the connection uses a Unix socket; configure the "
                                     "Spark jdbc_url")
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"jdbc:postgresql://{host}:{info.port}/{info.dbname}", props

    def _frames(self, spark: Any, conn: psycopg.Connection[Any], plan: BatchPlan,
                init: str, types: dict[str, int]) -> list[Any]:
        """One JDBC DataFrame per read; fills ``types`` (output name → type oid)."""
        url, props = self._jdbc(conn)
        props.update({"sessionInitStatement": init, "fetchsize": str(self.settings.fetch_size),
                      "preferTimestampNTZ": "true"})
        frames = []
        for read in plan.reads:
            read_types = self._read_types(conn, read)
            types.update(read_types)
            table = sql.SQL("({}) AS {}").format(
                _guarded_query(read, read_types), sql.Identifier(f"imp_r{read.index}")
            ).as_string(conn)
            predicates = [p.as_string(conn)
                          for p in read.partition_predicates(self.settings.max_partitions)]
            try:
                if predicates:
                    frame = spark.read.jdbc(url, table, predicates=predicates,
                                            properties=props)
                else:
                    frame = spark.read.jdbc(url, table, properties=props)
            except Exception as exc:  # noqa: BLE001 — py4j wraps every JVM error
                raise BackendJobFailed(f"JDBC read of {read.schema}.{read.name} failed: "
                                       f"{_first_line(exc)}") from exc
            frames.append(frame)
        if len(frames) > 1:
            from pyspark.sql import functions as F
            sizes = [self._rows(conn, read) for read in plan.reads]
            largest = max(range(len(sizes)), key=lambda i: sizes[i])
            frames = [F.broadcast(f) if i != largest and 0 <= sizes[i]
                      <= self.settings.broadcast_rows else f for i, f in enumerate(frames)]
        return frames

    def _rows(self, conn: psycopg.Connection[Any], read: TableRead) -> float:
        """PostgreSQL's row estimate of the table (-1: never analysed)."""
        row = conn.execute(
            "SELECT c.reltuples FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = %s", (read.schema, read.name)).fetchone()
        return -1.0 if row is None else float(row[0])

    def _read_types(self, conn: psycopg.Connection[Any], read: TableRead) -> dict[str, int]:
        """Output name → type oid of ``read`` (planned, never run); raises
        :class:`BackendUnsupported` for a type Spark does not map exactly."""
        query = sql.SQL("SELECT * FROM ({}) AS q LIMIT 0").format(read.query())
        with _pushed_down(conn, read):
            cur = conn.execute(query)
        for col in cur.description or ():
            if col.name == read.partition_column:
                continue  # compared inside PostgreSQL only
            if col.type_code not in _EXACT_TYPES:
                raise BackendUnsupported(f"column {col.name} of {read.schema}.{read.name}: "
                                         f"type oid {col.type_code} is not mapped exactly")
            if col.type_code == NUMERIC:
                _check_numeric(read, col.name, col.precision, col.scale)
        return {col.name: col.type_code for col in cur.description or ()}

    def _joined(self, plan: BatchPlan, frames: Sequence[Any]) -> Any:
        """Inner joins in table order on the join equalities (cross joins when unconnected)."""
        columns = {name: i for i, f in enumerate(frames) for name in f.columns}
        df = frames[0]
        have = {0}
        pending = list(plan.joins)
        for i in range(1, len(frames)):
            conds = []
            rest = []
            for a, b in pending:
                ta, tb = columns[a], columns[b]
                if {ta, tb} <= have | {i} and i in (ta, tb) and ta != tb:
                    conds.append(df[a if ta != i else b] == frames[i][b if ta != i else a])
                else:
                    rest.append((a, b))
            pending = rest
            if conds:
                df = df.join(frames[i], reduce(lambda x, y: x & y, conds), "inner")
            else:
                df = df.crossJoin(frames[i])
            have.add(i)
        for a, b in pending:  # equalities within one table, or between already joined ones
            df = df.filter(df[a] == df[b])
        return df

    # -- jobs ----------------------------------------------------------------------------

    def _grouped(self, plan: BatchPlan, frames: Sequence[Any]) -> Any:
        from pyspark.sql import functions as F
        df = self._joined(plan, frames)
        aggs = [F.count(F.lit(1)).alias("__n")]
        for a in plan.aggregates:
            if a.function == "count_star":
                aggs.append(F.count(F.lit(1)).alias(a.name))
            elif a.function == "count":
                aggs.append(F.count(F.col(str(a.arg))).alias(a.name))
            elif a.function in ("sum", "min", "max"):
                fn = {"sum": F.sum, "min": F.min, "max": F.max}[a.function]
                aggs.append(fn(F.col(str(a.arg))).alias(a.name))
            # avg is refused in HAVING / ORDER BY by the plan, so it is not needed here
        aggs += [F.collect_set(F.col(f)).alias(f"s_{f}") for f in plan.fragment_columns]
        return df.groupBy(*plan.keys).agg(*aggs)

    def _capture_job(self, plan: BatchPlan, frames: Sequence[Any],
                     c_collation: bool) -> list[set[int]]:
        """Distinct ``(slot, fragment)`` pairs of the result rows, in one pass over the data
        (the grouped frame is cached while top-k reads it several times). Text compared by
        HAVING or ORDER BY is refused unless it compares as in C, grouped or not (found: a
        top-k over rows ordered by an ``"en-x-icu"`` column kept the code-point order)."""
        from pyspark.sql import functions as F
        cached = None
        if plan.grouped:
            df = self._grouped(plan, frames)
            if not c_collation:
                _check_collation(plan, df)
            if plan.having is not None:
                df = df.filter(_column(plan.having, df))
            if plan.limit is not None:
                df = cached = df.persist()
                df = self._top(df, plan.order, plan.limit)
            tagged = [F.transform(F.col(f"s_{f}"), _tagger(i))
                      for i, f in enumerate(plan.fragment_columns)]
        else:
            df = self._joined(plan, frames)
            if not c_collation:
                _check_collation(plan, df)
            if plan.limit is not None:
                df = self._top(df, plan.order, plan.limit)
            tagged = [F.array(F.struct(F.lit(i).alias("slot"), F.col(f).alias("f")))
                      for i, f in enumerate(plan.fragment_columns)]
        out: list[set[int]] = [set() for _ in range(plan.slots)]
        if not tagged:
            return out
        pairs = df.select(F.explode(F.concat(*tagged)).alias("p")) \
            .select("p.slot", "p.f").distinct()
        try:
            for row in self._collect(pairs):
                out[int(row[0])].add(int(row[1]))
        finally:
            if cached is not None:
                cached.unpersist()
        return out

    def _top(self, df: Any, order: Sequence[OrderKey], limit: int) -> Any:
        """The first ``limit`` rows in ``order`` and every row tied with the last of them
        (``FETCH FIRST k ROWS WITH TIES``): the rows that precede or equal the k-th key."""
        from pyspark.sql import functions as F
        if limit <= 0:
            return df.limit(0)
        names = [f"__o{i}" for i in range(len(order))]
        for name, o in zip(names, order, strict=True):
            df = df.withColumn(name, _column(o.node, df))
        sort = []
        for name, o in zip(names, order, strict=True):
            c = F.col(name)
            if o.descending:
                sort.append(c.desc_nulls_first() if o.nulls_first else c.desc_nulls_last())
            else:
                sort.append(c.asc_nulls_first() if o.nulls_first else c.asc_nulls_last())
        first = df.orderBy(*sort).limit(limit)
        rows = self._collect(first.select(*names))
        if len(rows) < limit:
            return df
        kth = rows[-1]
        tie = reduce(lambda a, b: a & b, [F.col(n).eqNullSafe(_literal(kth[i], df.schema[n]))
                                          for i, n in enumerate(names)])
        return first.unionByName(df.filter(tie))

    def _state_job(self, plan: BatchPlan, frames: Sequence[Any], limit: int | None,
                   types: dict[str, int]
                   ) -> tuple[list[PartialRow], list[ValueRow], list[tuple[Row, int]]]:
        from pyspark.sql import Window
        from pyspark.sql import functions as F
        df = self._joined(plan, frames)
        fcols = list(plan.fragment_columns)
        aggs = [F.count(F.lit(1)).alias("__n")]
        for a in plan.aggregates:
            if a.arg is None:
                aggs.append(F.count(F.lit(1)))
                continue
            if a.function in ("sum", "avg"):
                aggs.append(F.sum(F.col(a.arg)))
            aggs.append(F.count(F.col(a.arg)))
        grouped = df.groupBy(*plan.keys, *fcols).agg(*aggs)
        nk, nf = len(plan.keys), len(fcols)
        partials = []
        for r in self._collect(grouped):
            pos = nk + nf + 1
            parts: list[Any] = []
            for a in plan.aggregates:
                if a.function in ("sum", "avg"):
                    parts.append((_sum_value(types.get(str(a.arg)), r[pos]), int(r[pos + 1])))
                    pos += 2
                else:
                    parts.append(int(r[pos]))
                    pos += 1
            partials.append(PartialRow(tuple(r[:nk]), tuple(r[nk:nk + nf]), int(r[nk + nf]),
                                       tuple(parts)))
        values: list[ValueRow] = []
        truncated: list[tuple[Row, int]] = []
        for j, a in enumerate(plan.aggregates):
            if a.function not in ("min", "max"):
                continue
            v = F.col(str(a.arg))
            counted = df.filter(v.isNotNull()).groupBy(*plan.keys, str(a.arg)).agg(
                F.count(F.lit(1)).alias("__m"))
            window = Window.partitionBy(*plan.keys)
            ordered = window.orderBy(v.desc() if a.function == "max" else v.asc())
            ranked = counted.withColumn("__rk", F.row_number().over(ordered)) \
                .withColumn("__nd", F.count(F.lit(1)).over(window))
            if limit is not None:
                ranked = ranked.filter(F.col("__rk") <= limit)
            cut = set()
            for r in self._collect(ranked.select(*plan.keys, str(a.arg), "__m", "__nd")):
                key = tuple(r[:nk])
                values.append(ValueRow(key, j, r[nk], int(r[nk + 1])))
                if limit is not None and int(r[nk + 2]) > limit:
                    cut.add((key, j))
            truncated += sorted(cut, key=repr)
        return partials, values, truncated

    def _collect(self, df: Any) -> list[Any]:
        try:
            return list(df.collect())
        except Exception as exc:  # noqa: BLE001 — py4j wraps every JVM error
            raise BackendJobFailed(f"Spark job failed: {_first_line(exc)}") from exc



@contextmanager
def _pushed_down(conn: psycopg.Connection[Any], read: TableRead) -> Iterator[None]:
    """A savepoint for SQL about ``read`` on the caller's connection (a failure leaves the
    caller's transaction intact), its failure raised as :class:`BackendJobFailed`."""
    try:
        with conn.transaction():
            yield
    except psycopg.Error as exc:
        raise BackendJobFailed(f"pushed-down read of {read.schema}.{read.name} failed in "
                               f"PostgreSQL: {exc}") from exc


_GREGORIAN = "1582-10-15"


def _guarded_query(read: TableRead, types: Mapping[str, int]) -> sql.Composable:
    """``read``'s query, whose date and timestamp outputs fail in PostgreSQL (the job fails,
    so the work runs in PostgreSQL) for a value before the Gregorian reform or infinite:
    pgjdbc reads through the JVM's hybrid Julian/Gregorian calendar, so 1582-10-12 came back
    as 1582-10-22 and ordered after 1582-10-15 (found). The error branch reads the row's
    value, so PostgreSQL cannot fold it into a planning-time error; the partition column is
    compared inside PostgreSQL only and left as is."""
    guarded = [n for n, t in types.items() if t in _DATETIMES and n != read.partition_column]
    if not guarded:
        return read.query()
    cols: list[sql.Composable] = []
    for name in types:
        col = sql.Identifier("imp_g", name)
        if name in guarded:
            date = types[name] == DATE
            fail = sql.SQL("(('not read by Spark (pre-Gregorian or infinite): ' || {c}::text)"
                           "::int{days})").format(c=col, days=sql.SQL(
                               "" if date else " * interval '1 day'"))
            cols.append(sql.SQL(
                "CASE WHEN {c} IS NULL OR ({c} >= {g}::{t} AND {c} < 'infinity'::{t})"
                " THEN {c} ELSE {c} + {fail} END AS {n}").format(
                    c=col, g=sql.Literal(_GREGORIAN), t=sql.SQL("date" if date else "timestamp"),
                    fail=fail, n=sql.Identifier(name)))
        else:
            cols.append(col)
    return sql.SQL("SELECT {} FROM ({}) AS imp_g").format(sql.SQL(", ").join(cols),
                                                          read.query())


def _check_collation(plan: BatchPlan, df: Any) -> None:
    """BackendUnsupported when HAVING / ORDER BY compare text: Spark compares code points,
    and the database's or a read column's collation is not C."""
    from pyspark.sql.types import StringType
    used: set[str] = set()
    for node in [plan.having, *(o.node for o in plan.order)]:
        if node is not None:
            used |= _refs(node)
    text = [n for n in used if isinstance(df.schema[n].dataType, StringType)]
    if text:
        raise BackendUnsupported(f"text compared in Spark ({text}) under a collation "
                                 "other than C")


def _check_numeric(read: TableRead, name: str, precision: int | None,
                   scale: int | None) -> None:
    """BackendUnsupported for a numeric Spark does not read exactly: unconstrained (Spark
    caps the scale), or ``numeric(p, s)`` beyond Spark's ``decimal(38, 38)``: Spark bounds
    the type and rounds every value on read (found: a ``numeric(50,45)`` 1e-42 read as 0)."""
    where = f"column {name} of {read.schema}.{read.name}"
    if precision is None or scale is None:
        raise BackendUnsupported(f"{where}: unconstrained numeric (Spark caps the scale)")
    if not (precision <= _MAX_DECIMAL and 0 <= scale <= _MAX_DECIMAL):
        raise BackendUnsupported(f"{where}: numeric({precision},{scale}) exceeds Spark's "
                                 f"decimal({_MAX_DECIMAL},{_MAX_DECIMAL})")


def _check_text_extremes(plan: BatchPlan, types: Mapping[str, int], c_collation: bool) -> None:
    """BackendUnsupported for a state keeping ``min`` / ``max`` of text unless it compares
    as in C: Spark ranks the values by code points (found: under "en-x-icu" the kept
    minimum values of a group were 'B', 'D' where PostgreSQL's are 'a', 'B')."""
    if c_collation:
        return
    text = [a.arg for a in plan.aggregates
            if a.function in ("min", "max") and types.get(str(a.arg)) in _TEXTS]
    if text:
        raise BackendUnsupported(f"min/max of text ({text}) kept by Spark under a collation "
                                 "other than C")


def _sum_value(type_oid: int | None, value: Any) -> Any:
    """``sum`` in PostgreSQL's result type: numeric for bigint input."""
    if value is None:
        return None
    if type_oid == INT8:
        return Decimal(int(value))
    return value


def _literal(value: Any, field: Any) -> Any:
    """``value`` (collected from column ``field``) as a literal of the column's own type.
    ``F.lit`` of a naive datetime is a TIMESTAMP built in the Python process's local
    TimeZone, compared with the TIMESTAMP_NTZ column in Spark's session zone: with
    TZ=America/New_York the top-k tie filter matched nothing and lost the tied groups
    (found). Its ISO text cast to the column's type means the same wall-clock value."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampNTZType
    if not isinstance(value, dt.datetime):
        return F.lit(value)
    if not isinstance(field.dataType, TimestampNTZType) or value.tzinfo is not None:
        raise BackendUnsupported(f"top-k over {field.name} of type {field.dataType}")
    return F.lit(value.isoformat(sep=" ")).cast(field.dataType)


def _tagger(slot: int) -> Any:
    """``f -> struct(slot, f)`` for ``F.transform`` (a one-argument function)."""
    from pyspark.sql import functions as F

    def tag(f: Any) -> Any:
        return F.struct(F.lit(slot).alias("slot"), f.alias("f"))

    return tag


def _first_line(exc: BaseException) -> str:
    """The error's first line, and PostgreSQL's error when a JDBC read failed (py4j's first
    line says only which call failed; a guarded read's error says why, see
    :func:`_guarded_query`)."""
    text = str(exc).strip()
    line = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
    marker = "PSQLException: "
    if marker in text:
        line += " — " + text.split(marker, 1)[1].splitlines()[0]
    return line


def _no_float_overflow(result: Any, a: Any, b: Any) -> Any:
    """``result`` of ``a op b``, failing the job where finite operands give an infinite
    result: PostgreSQL raises ``value out of range: overflow`` there (float8 arithmetic),
    Spark gives Infinity, which passed or failed HAVING where the query itself fails (the
    router then captures in PostgreSQL, which raises the query's own error). Integer and
    decimal overflow already fail in ANSI mode; an infinite operand (PostgreSQL's
    'Infinity') stays infinite without an error in both."""
    from pyspark.sql import functions as F
    inf = F.lit(float("inf"))
    overflow = (F.abs(result) == inf) & (F.abs(a) != inf) & (F.abs(b) != inf)
    return F.when(overflow, F.raise_error(F.lit("value out of range: overflow"))) \
        .otherwise(result)


def _refs(node: Node) -> set[str]:
    if isinstance(node, Ref):
        return {node.name}
    if isinstance(node, Bin):
        return _refs(node.left) | _refs(node.right)
    if isinstance(node, BoolOp):
        return set().union(*(_refs(a) for a in node.args))
    if isinstance(node, Not | IsNull | Neg):
        return _refs(node.arg)
    return set()


def _column(node: Node, df: Any) -> Any:
    """A :data:`Node` over ``df``'s columns as a Spark Column (SQL three-valued logic on both
    sides)."""
    from pyspark.sql import functions as F
    if isinstance(node, Ref):
        return F.col(node.name)
    if isinstance(node, Lit):
        return F.lit(node.value).cast("long") if node.pg_type == "int8" else F.lit(node.value)
    if isinstance(node, Neg):
        return -_column(node.arg, df)
    if isinstance(node, Bin):
        a, b = _column(node.left, df), _column(node.right, df)
        if node.op == "*":
            _check_decimal_product(df, node, a, b)
        if node.op not in ARITHMETIC:
            a, b = _as_numeric(df, a, node.right), _as_numeric(df, b, node.left)
        ops = {"=": a == b, "<>": a != b, "!=": a != b, "<": a < b, "<=": a <= b,
               ">": a > b, ">=": a >= b, "+": a + b, "-": a - b, "*": a * b}
        result = ops[node.op]
        if node.op in ARITHMETIC and _is_float(df, result):
            return _no_float_overflow(result, a, b)
        return result
    if isinstance(node, BoolOp):
        cols = [_column(a, df) for a in node.args]
        if node.op == "and":
            return reduce(lambda x, y: x & y, cols)
        return reduce(lambda x, y: x | y, cols)
    if isinstance(node, Not):
        return ~_column(node.arg, df)
    arg = _column(node.arg, df)
    return arg.isNotNull() if node.negated else arg.isNull()


_INTEGRAL_DIGITS = {"ByteType": 3, "ShortType": 5, "IntegerType": 10, "LongType": 20}


def _as_numeric(df: Any, column: Any, other: Node) -> Any:
    """``column`` (over ``df``) as an exact decimal when it is an integer compared with a
    numeric constant ``other``, as PostgreSQL compares them (integer → numeric). Spark's
    analyzer — not an optimizer rule that can be excluded (:data:`EXCLUDED_RULES`) — turns
    ``<integer> > <decimal literal beyond bigint>`` into a constant: found, ``max(b) *
    90000000000000000 > 9223372036854775808`` never ran the product that fails 'bigint out
    of range' in PostgreSQL, and ``max(b) > -9223372036854775809`` was true for a NULL
    ``max(b)``."""
    from pyspark.sql.types import DecimalType
    if not (isinstance(other, Lit) and isinstance(other.value, Decimal)):
        return column
    digits = _INTEGRAL_DIGITS.get(type(df.select(column).schema.fields[0].dataType).__name__)
    return column if digits is None else column.cast(DecimalType(digits, 0))


def _check_decimal_product(df: Any, node: Bin, a: Any, b: Any) -> None:
    """BackendUnsupported for a decimal ``a * b`` whose exact type (precision p1 + p2 + 1,
    scale s1 + s2) exceeds Spark's 38 digits: Spark bounds it to ``decimal(38, 38)`` and
    rounds, PostgreSQL's numeric product is exact (found: ``max(w) * max(w) > 0`` with
    ``w numeric(20,20)`` = 1e-20 was false in Spark)."""
    from pyspark.sql.types import DecimalType
    types = [df.select(c).schema.fields[0].dataType for c in (a, b)]
    if not any(isinstance(t, DecimalType) for t in types):
        return
    digits = [_decimal_digits(n, t) for n, t in zip((node.left, node.right), types, strict=True)]
    if None in digits:
        return   # a float operand: Spark multiplies as double, as PostgreSQL does
    precision = sum(d[0] for d in digits if d is not None) + 1
    scale = sum(d[1] for d in digits if d is not None)
    if precision > _MAX_DECIMAL or scale > _MAX_DECIMAL:
        raise BackendUnsupported(f"decimal product of exact type numeric({precision},{scale})"
                                 f" exceeds Spark's {_MAX_DECIMAL} digits")


def _decimal_digits(node: Node, dtype: Any) -> tuple[int, int] | None:
    """(precision, scale) Spark gives an operand of a decimal product (an integer literal
    takes its own digits), None when it is not exact."""
    from pyspark.sql.types import DecimalType
    if isinstance(dtype, DecimalType):
        return dtype.precision, dtype.scale
    if isinstance(node, Lit) and node.pg_type is None and type(node.value) is int:
        return len(str(abs(node.value))), 0
    digits = _INTEGRAL_DIGITS.get(type(dtype).__name__)
    return None if digits is None else (digits, 0)


def _is_float(df: Any, column: Any) -> bool:
    """Is ``column`` (over ``df``) of a floating-point type? (Analysed, not run.)"""
    from pyspark.sql.types import DoubleType, FloatType
    return isinstance(df.select(column).schema.fields[0].dataType, DoubleType | FloatType)
