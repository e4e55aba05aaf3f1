"""Where a heavy job runs: PostgreSQL or Spark, from PostgreSQL's own estimates.

The model is deliberately simple and explainable. For a job over tables ``T1 … Tk`` it reads
``pg_class.reltuples`` (rows PostgreSQL believes each table has) and, when a query is given,
the total cost of its plan from ``EXPLAIN (FORMAT JSON)`` (planner cost units, ~ sequential
page reads). Spark is chosen only when both exceed their thresholds — a Spark job carries a
fixed overhead (≈1 s per job on a warm local session, DESIGN §9) and pays for moving every row
through JDBC, so it can only win on work that PostgreSQL itself estimates as large — and only
when the session is ready. The measured crossover lives in ``bench/results/spark_bench.md``;
the defaults come from there (on 2 cores PostgreSQL won at every size measured, so the default
thresholds are set high: ``auto`` stays on PostgreSQL unless a cluster makes Spark cheaper,
which the operator states by lowering them).

:func:`choose` returns the decision *and* a sentence saying why, for ``IMP EXPLAIN`` and logs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

log = logging.getLogger(__name__)

MODES = ("auto", "postgres", "spark")


@dataclass(frozen=True, slots=True)
class CostSettings:
    """``mode``: ``auto`` (the model decides), ``postgres`` or ``spark`` (forced; a forced
    Spark job still falls back to PostgreSQL when Spark fails). Spark is chosen in ``auto``
    when the job's tables hold at least ``spark_min_rows`` rows *and* the plan's total cost is
    at least ``spark_min_cost``."""

    mode: str = "auto"
    spark_min_rows: float = 200_000_000.0
    spark_min_cost: float = 5_000_000.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"heavy backend must be one of {MODES}, not {self.mode!r}")


@dataclass(frozen=True, slots=True)
class Estimate:
    rows: float
    cost: float | None
    tables: tuple[tuple[str, str, float], ...]

    def describe(self) -> str:
        cost = "n/a" if self.cost is None else f"{self.cost:,.0f}"
        return f"~{self.rows:,.0f} rows, plan cost {cost}"


@dataclass(frozen=True, slots=True)
class Choice:
    backend: str  # postgres | spark
    reason: str
    estimate: Estimate | None = None


def estimate(conn: psycopg.Connection[Any], tables: Sequence[tuple[str, str]],
             query: str | None = None, params: Sequence[object] | None = None,
             explain_min_rows: float = 0.0) -> Estimate:
    """PostgreSQL's estimates for a job over ``tables`` (``(schema, name)``) running
    ``query`` (``$n`` parameters bound from ``params``). ``reltuples`` is -1 for a table never
    analysed; it then counts as its page count × 100. The query is EXPLAINed only when the
    tables hold at least ``explain_min_rows`` rows (below, the row count decides alone)."""
    sizes = []
    for schema, name in tables:
        row = conn.execute(
            "SELECT c.reltuples, c.relpages FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = %s", (schema, name)).fetchone()
        tuples = 0.0
        if row is not None:
            tuples = float(row[0]) if float(row[0]) >= 0 else float(row[1]) * 100.0
        sizes.append((schema, name, tuples))
    rows = sum(s[2] for s in sizes)
    cost = None
    if query is not None and rows >= explain_min_rows:
        cost = plan_cost(conn, query, params)
    return Estimate(rows, cost, tuple(sizes))


def plan_cost(conn: psycopg.Connection[Any], query: str,
              params: Sequence[object] | None = None) -> float | None:
    """Total cost of ``query``'s plan, or None when EXPLAIN fails (never raises)."""
    plan = top_plan(conn, query, params)
    return None if plan is None else float(plan["Total Cost"])


def top_plan(conn: psycopg.Connection[Any], query: str,
             params: Sequence[object] | None = None) -> dict[str, Any] | None:
    """The top node of ``query``'s plan (``$n`` parameters bound from ``params``), planned in
    a savepoint, not run; None when EXPLAIN fails (never raises)."""
    doc = explain(conn, query, params)
    return None if doc is None else dict(doc["Plan"])


def explain(conn: psycopg.Connection[Any], query: str,
            params: Sequence[object] | None = None) -> dict[str, Any] | None:
    """``EXPLAIN (FORMAT JSON)`` of ``query`` as :func:`top_plan` plans it: ``Plan`` and, when
    PostgreSQL would compile the plan, ``JIT``."""
    try:
        with conn.transaction(), psycopg.RawCursor(conn) as cur:
            cur.execute("EXPLAIN (FORMAT JSON) " + query, list(params) if params else None)
            row = cur.fetchone()
    except psycopg.Error as exc:
        log.debug("EXPLAIN failed: %s", exc)
        return None
    if row is None:
        return None
    doc = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return dict(doc[0])


def choose(settings: CostSettings, est: Estimate | None, spark_ready: bool,
           spark_status: str) -> Choice:
    """The backend for one job and why."""
    if settings.mode == "postgres":
        return Choice("postgres", "heavy backend forced to postgres", est)
    if settings.mode == "spark":
        if not spark_ready:
            return Choice("postgres", f"heavy backend forced to spark, but Spark is "
                          f"unavailable ({spark_status}): PostgreSQL instead", est)
        return Choice("spark", "heavy backend forced to spark", est)
    if est is None:
        return Choice("postgres", "no estimate: PostgreSQL", est)
    small = est.rows < settings.spark_min_rows
    cheap = est.cost is not None and est.cost < settings.spark_min_cost
    what = est.describe()
    if small or cheap:
        limits = (f"Spark needs >= {settings.spark_min_rows:,.0f} rows and plan cost >= "
                  f"{settings.spark_min_cost:,.0f}")
        return Choice("postgres", f"{what}: below the Spark thresholds ({limits})", est)
    if not spark_ready:
        return Choice("postgres", f"{what} would suit Spark, but it is unavailable "
                      f"({spark_status})", est)
    return Choice("spark", f"{what}: above the Spark thresholds", est)
