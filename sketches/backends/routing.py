"""The backend the manager calls: picks PostgreSQL or Spark per job and falls back.

``RoutedBackend`` implements :class:`~sketches.backends.base.ExecutionBackend`. For every job it
asks :func:`sketches.cost.choose` (PostgreSQL's estimates, configured thresholds, forced mode,
Spark readiness); a Spark job that is refused (:class:`BackendUnsupported`), unavailable or
fails is re-run on PostgreSQL with the reason logged — the caller only ever sees the PostgreSQL
result or PostgreSQL's own error. The last decisions are kept (:attr:`decisions`) for
``IMP EXPLAIN`` / ``IMP SHOW STATS``.

In ``auto`` mode Spark is started lazily: the first job the model would give to Spark starts
the session in the background and itself runs on PostgreSQL.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from sketches.backends.base import (
    AggregateState,
    BackendError,
    FullMaintenance,
    MatchRequest,
    Row,
)
from sketches.backends.postgres import PostgresBackend, resolve_schemas
from sketches.capture import CaptureResult, CaptureTarget, capture_sql
from sketches.cost import Choice, CostSettings, choose, estimate
from sketches.sql.model import QueryAnalysis

if TYPE_CHECKING:
    from sketches.backends.spark import SparkBackend

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Decision:
    """One routed job: where it was meant to run, where it ran, and why."""

    job: str
    chosen: str
    ran_on: str
    reason: str
    seconds: float
    at: float


class RoutedBackend:
    """PostgreSQL by default, Spark when the cost model (or the configuration) says so."""

    name = "routed"

    def __init__(self, cost: CostSettings | None = None, spark: SparkBackend | None = None,
                 postgres: PostgresBackend | None = None, history: int = 100) -> None:
        self.cost = cost or CostSettings()
        self.postgres = postgres or PostgresBackend()
        self.spark = spark  # a SparkBackend, or None when Spark is not configured
        self.decisions: deque[Decision] = deque(maxlen=history)
        self.counters: Counter[str] = Counter()
        self._lock = threading.Lock()
        if self.spark is not None and self.cost.mode == "spark":
            self.spark.runtime.start()

    # -- choice ----------------------------------------------------------------------------

    def spark_status(self) -> tuple[bool, str]:
        if self.spark is None:
            return False, "Spark backend not configured"
        rt = self.spark.runtime
        return rt.ready, rt.reason

    def choose(self, conn: psycopg.Connection[Any], tables: Sequence[tuple[str, str]],
               query: str | None = None, params: Sequence[object] | None = None) -> Choice:
        """The decision for a job over ``tables`` running ``query`` (no side effects besides
        starting Spark in the background when it would be chosen)."""
        if self.cost.mode == "postgres":
            return choose(self.cost, None, False, "")
        est = estimate(conn, tables, query, params,
                       explain_min_rows=0.0 if self.cost.mode == "spark"
                       else self.cost.spark_min_rows)
        ready, status = self.spark_status()
        choice = choose(self.cost, est, ready, status)
        if (choice.backend == "postgres" and self.spark is not None and not ready
                and self.spark.runtime.state == "stopped"
                and choose(self.cost, est, True, "").backend == "spark"):
            log.info("starting Spark in the background for future jobs (%s)", est.describe())
            self.spark.runtime.start()
        return choice

    def explain(self, conn: psycopg.Connection[Any], sql_text: str, analysis: QueryAnalysis,
                targets: Sequence[CaptureTarget],
                params: Sequence[object] | None = None) -> Choice:
        """Where a capture of this query would run, and why (``IMP EXPLAIN``)."""
        tables = list(zip(resolve_schemas(conn, analysis, targets),
                          (t.name for t in analysis.tables), strict=True))
        return self.choose(conn, tables, capture_sql(sql_text, analysis, targets), params)

    def _route(self, job: str, choice: Choice, on_spark: Callable[[], T],
               on_postgres: Callable[[], T]) -> T:
        started = time.perf_counter()
        ran_on, reason = choice.backend, choice.reason
        result: T
        if choice.backend == "spark":
            try:
                result = on_spark()
            except BackendError as exc:
                reason = f"{choice.reason}; Spark {type(exc).__name__}: {exc}; ran on PostgreSQL"
                log.warning("%s: %s", job, reason)
                ran_on = "postgres"
                result = on_postgres()
            except Exception as exc:  # noqa: BLE001 — a bug or an unwrapped py4j error
                reason = (f"{choice.reason}; Spark failed unexpectedly "
                          f"({type(exc).__name__}: {exc}); ran on PostgreSQL")
                log.exception("%s: %s", job, reason)
                ran_on = "postgres"
                result = on_postgres()
        else:
            result = on_postgres()
        decision = Decision(job, choice.backend, ran_on, reason,
                            time.perf_counter() - started, time.time())
        self._record(decision)
        log.info("%s on %s (%s) in %.1f ms", job, ran_on, reason, decision.seconds * 1e3)
        return result

    def last_decision(self) -> Decision | None:
        with self._lock:
            return self.decisions[-1] if self.decisions else None

    # -- the ExecutionBackend operations ---------------------------------------------------

    def _tables(self, conn: psycopg.Connection[Any], analysis: QueryAnalysis,
                targets: Sequence[CaptureTarget]) -> list[tuple[str, str]]:
        return list(zip(resolve_schemas(conn, analysis, targets),
                        (t.name for t in analysis.tables), strict=True))

    def capture(self, conn: psycopg.Connection[Any], sql_text: str, analysis: QueryAnalysis,
                targets: Sequence[CaptureTarget],
                params: Sequence[object] | None = None) -> CaptureResult:
        choice = self.explain(conn, sql_text, analysis, targets, params) \
            if self.cost.mode != "postgres" else choose(self.cost, None, False, "")
        return self._route(
            "capture", choice,
            lambda: self.spark.capture(conn, sql_text, analysis, targets, params),  # type: ignore[union-attr]
            lambda: self.postgres.capture(conn, sql_text, analysis, targets, params))

    def build_state(self, conn: psycopg.Connection[Any], analysis: QueryAnalysis,
                    targets: Sequence[CaptureTarget], params: Sequence[object] | None = None,
                    buffer_limit: int | None = None) -> AggregateState:
        choice = self.choose(conn, self._tables(conn, analysis, targets)) \
            if self.cost.mode != "postgres" else choose(self.cost, None, False, "")
        return self._route(
            "build_state", choice,
            lambda: self.spark.build_state(conn, analysis, targets, params, buffer_limit),  # type: ignore[union-attr]
            lambda: self.postgres.build_state(conn, analysis, targets, params, buffer_limit))

    def spark_state(self, conn: psycopg.Connection[Any], analysis: QueryAnalysis,
                    targets: Sequence[CaptureTarget], params: Sequence[object] | None = None,
                    buffer_limit: int | None = None) -> AggregateState | None:
        """Aggregate state built by Spark when the cost model picks Spark for this job and
        the job succeeds; ``None`` means "build it in PostgreSQL yourself" (the incremental
        pipeline's own state queries), with the reason logged and recorded."""
        if self.spark is None or self.cost.mode == "postgres" or not analysis.is_aggregate:
            return None
        choice = self.choose(conn, self._tables(conn, analysis, targets))
        if choice.backend != "spark":
            self._record(Decision("build_state", "postgres", "postgres", choice.reason, 0.0,
                                  time.time()))
            return None
        started = time.perf_counter()
        try:
            state = self.spark.build_state(conn, analysis, targets, params, buffer_limit)
        except Exception as exc:  # noqa: BLE001 — any Spark failure: PostgreSQL builds it
            reason = f"{choice.reason}; Spark {type(exc).__name__}: {exc}; ran on PostgreSQL"
            log.warning("build_state: %s", reason)
            self._record(Decision("build_state", "spark", "postgres", reason,
                                  time.perf_counter() - started, time.time()))
            return None
        self._record(Decision("build_state", "spark", "spark", choice.reason,
                              time.perf_counter() - started, time.time()))
        return state

    def _record(self, decision: Decision) -> None:
        with self._lock:
            self.decisions.append(decision)
            self.counters[f"{decision.job}_{decision.ran_on}"] += 1
            if decision.ran_on != decision.chosen:
                self.counters["spark_fallbacks"] += 1

    def full_maintenance(self, conn: psycopg.Connection[Any], sql_text: str,
                         analysis: QueryAnalysis, targets: Sequence[CaptureTarget],
                         params: Sequence[object] | None = None,
                         buffer_limit: int | None = None) -> FullMaintenance:
        choice = self.explain(conn, sql_text, analysis, targets, params) \
            if self.cost.mode != "postgres" else choose(self.cost, None, False, "")
        return self._route(
            "full_maintenance", choice,
            lambda: self.spark.full_maintenance(  # type: ignore[union-attr]
                conn, sql_text, analysis, targets, params, buffer_limit),
            lambda: self.postgres.full_maintenance(
                conn, sql_text, analysis, targets, params, buffer_limit))

    def match_rows(self, conn: psycopg.Connection[Any], request: MatchRequest,
                   keys: Collection[Row]) -> list[Row]:
        choice = self.choose(conn, [(request.schema, request.table)]) \
            if self.cost.mode != "postgres" else choose(self.cost, None, False, "")
        return self._route(
            "match_rows", choice,
            lambda: self.spark.match_rows(conn, request, keys),  # type: ignore[union-attr]
            lambda: self.postgres.match_rows(conn, request, keys))

    def stats(self) -> dict[str, object]:
        """``IMP SHOW STATS`` rows: the mode, Spark's state and why, job counters
        (``<job>_<ran on>``, ``spark_fallbacks``) and the last decision with its reason."""
        ready, status = self.spark_status()
        with self._lock:
            out: dict[str, object] = dict(self.counters)
            last = self.decisions[-1] if self.decisions else None
        out.update({"heavy_backend": self.cost.mode, "spark_ready": ready,
                    "spark_status": status})
        if last is not None:
            out["heavy_backend_last"] = f"{last.job} on {last.ran_on}: {last.reason}"
        return out

    def close(self) -> None:
        """Stops the Spark session, if one was started (the proxy's shutdown)."""
        if self.spark is not None and self.spark.runtime.state != "stopped":
            self.spark.runtime.stop()


def make_heavy_backend(mode: str = "auto", spark_table: dict[str, Any] | None = None,
                       cost: CostSettings | None = None,
                       env: dict[str, str] | None = None) -> RoutedBackend:
    """The proxy's heavy backend from its configuration: ``mode`` is ``--heavy-backend``
    (``auto`` | ``postgres`` | ``spark``), ``spark_table`` the ``[spark]`` TOML table (``master``,
    ``jdbc_jar``, ``jdbc_url``, ``max_partitions``, any ``spark.*`` key), ``env`` the process
    environment (``IMP_SPARK_MASTER``, ``IMP_SPARK_CONF``, …). Never imports pyspark here:
    the Spark runtime does, in its background start."""
    from dataclasses import replace

    from sketches.backends.spark import SparkBackend, SparkRuntime, SparkSettings

    cost = replace(cost or CostSettings(), mode=mode)
    spark = None
    if mode != "postgres":
        spark = SparkBackend(SparkRuntime(SparkSettings.from_sources(env, spark_table)))
    return RoutedBackend(cost, spark)
