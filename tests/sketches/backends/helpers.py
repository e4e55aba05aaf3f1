"""Shared helpers: capture targets for a query, as the manager builds them."""

from __future__ import annotations

from typing import Any

import psycopg

from sketches.capture import CaptureTarget
from sketches.ranges import build_partition, column_info
from sketches.safety import check
from sketches.sql import QueryAnalysis, analyse


def targets_for(conn: psycopg.Connection[Any], sql_text: str, fragments: int,
                schema: str = "public") -> tuple[QueryAnalysis, list[CaptureTarget]]:
    """The analysed query and one target per sketchable table (its first safe attribute)."""
    analysis = analyse(sql_text)
    safety = check(analysis)
    assert safety.sketchable, safety.reason
    targets = []
    for index, attrs in safety.by_table().items():
        table = analysis.tables[index]
        column = attrs[0].column.column
        partition = build_partition(conn, schema, table.name, column, fragments)
        nullable = not column_info(conn, schema, table.name, column).not_null
        targets.append(CaptureTarget(table, schema, column, partition, nullable))
    return analysis, targets


def fragments_of(result: Any) -> list[list[int]]:
    return [sorted(p.fragments) for p in result.parts]
