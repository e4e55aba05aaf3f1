"""Sketch capture: one pushed-down query computes the fragment ids of every sketched table.

The capture query (``sketches.sql.rewrite.capture_statement``) runs the client's query with
extra outputs (the fragment ids) and aggregates them into one ``int[]`` per table inside
PostgreSQL: the result set never travels to Python, only one row of arrays. It runs on the
caller's connection, i.e. in the caller's snapshot, and returns ``pg_current_snapshot()`` of
that same statement as the sketch's version.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from sketches.errors import CaptureError
from sketches.ranges import RangePartition
from sketches.sketch import SketchPart
from sketches.sql.model import QueryAnalysis, TableRef
from sketches.sql.rewrite import FragmentTarget, capture_statement

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CaptureTarget:
    """Sketch ``table`` (resolved to ``schema``) on ``column`` with ``partition``."""

    table: TableRef
    schema: str
    column: str
    partition: RangePartition
    nullable: bool = True


@dataclass(frozen=True, slots=True)
class CaptureResult:
    version: str
    parts: tuple[SketchPart, ...]
    seconds: float
    sql: str


def _grouped(analysis: QueryAnalysis, t: CaptureTarget) -> bool:
    return t.table.scope == 0 and any(
        e.column is not None and e.column.table == t.table.index and e.column.column == t.column
        for e in analysis.group_by)


def capture_sql(sql: str, analysis: QueryAnalysis, targets: Sequence[CaptureTarget]) -> str:
    """The capture query for ``sql`` (see ``capture_statement``)."""
    return capture_statement(sql, analysis, [
        FragmentTarget(t.table.scope, t.table.alias, t.column, t.partition.type_name,
                       t.partition.array_literal, t.partition.null_fragment,
                       _grouped(analysis, t))
        for t in targets])


def capture(conn: psycopg.Connection[Any], sql: str, analysis: QueryAnalysis,
            targets: Sequence[CaptureTarget],
            params: Sequence[object] | None = None) -> CaptureResult:
    """Runs the capture query in ``conn``'s current transaction/snapshot."""
    if not targets:
        raise CaptureError("nothing to capture")
    query = capture_sql(sql, analysis, targets)
    started = time.perf_counter()
    try:
        with psycopg.RawCursor(conn) as cur:
            cur.execute(query, list(params) if params else None)
            row = cur.fetchone()
    except psycopg.Error as exc:
        raise CaptureError(f"capture query failed: {exc}") from exc
    seconds = time.perf_counter() - started
    if row is None or len(row) != len(targets) + 1:
        raise CaptureError("capture query returned no row")
    parts = tuple(
        SketchPart(t.table, t.schema, t.column, t.partition, frozenset(ids), t.nullable)
        for t, ids in zip(targets, row[1:], strict=True))
    log.debug("captured %s in %.1f ms", [len(p.fragments) for p in parts], seconds * 1e3)
    return CaptureResult(str(row[0]), parts, seconds, query)
