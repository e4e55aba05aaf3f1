"""Capture: the pushed-down query's shape, its snapshot and its result."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from sketches.capture import CaptureTarget, capture, capture_sql
from sketches.errors import CaptureError
from sketches.ranges import build_partition
from sketches.sql import analyse

COLUMNS = {"ct": ["id", "g", "v"], "cd": ["k", "w"]}


@pytest.fixture(scope="module")
def tables(db_dsn: str) -> str:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE ct AS SELECT i AS id, i % 50 AS g, i % 7 AS v"
                     " FROM generate_series(1, 5000) i")
        conn.execute("CREATE TABLE cd AS SELECT i AS k, i % 3 AS w FROM generate_series(0, 49) i")
    return db_dsn


def targets(conn: psycopg.Connection[Any], sql: str, columns: dict[str, str]
            ) -> tuple[Any, list[CaptureTarget]]:
    a = analyse(sql, lambda s, t: COLUMNS.get(t))
    out = []
    for t in a.tables:
        p = build_partition(conn, "public", t.name, columns[t.alias], fragments=10)
        out.append(CaptureTarget(t, "public", columns[t.alias], p))
    return a, out


def test_group_by_column_is_computed_per_group_equivalents_through_min(
        conn: psycopg.Connection[Any], tables: str) -> None:
    sql = "SELECT ct.g, count(*) FROM ct JOIN cd ON ct.g = cd.k GROUP BY ct.g ORDER BY 2 LIMIT 2"
    a, ts = targets(conn, sql, {"ct": "g", "cd": "k"})
    text = capture_sql(sql, a, ts)
    assert "COALESCE(width_bucket(ct.g," in text
    assert "min(COALESCE(width_bucket(cd.k," in text
    assert "FETCH FIRST 2 ROWS WITH TIES" in text
    assert text.startswith("WITH __imp_r AS MATERIALIZED (")


def test_fragment_ids_pass_up_through_a_from_subquery(conn: psycopg.Connection[Any],
                                                      tables: str) -> None:
    sql = ("SELECT q.key, count(*) FROM (SELECT ct.g AS key FROM ct WHERE ct.v = 3) q"
           " GROUP BY q.key HAVING count(*) > 14")
    a, ts = targets(conn, sql, {"ct": "g"})
    text = capture_sql(sql, a, ts)
    assert "AS __imp_f0 FROM ct WHERE" in text and "min(q.__imp_f0)" in text
    res = capture(conn, sql, a, ts)
    groups = conn.execute("SELECT g FROM ct WHERE v = 3 GROUP BY g HAVING count(*) > 14"
                          ).fetchall()
    assert res.parts[0].fragments == {ts[0].partition.fragment_of(g) for (g,) in groups}


def test_tables_are_named_in_the_schemas_of_the_analysis(conn: psycopg.Connection[Any],
                                                         tables: str) -> None:
    """A table the query names without a schema is qualified with the one its analysis
    carries (``QueryAnalysis.with_schemas``), in a FROM subquery too; one the query
    qualifies keeps its own, and the capture still reads the same rows."""
    sql = ("SELECT q.key, count(*) FROM (SELECT ct.g AS key FROM ct JOIN public.cd"
           " ON cd.k = ct.g WHERE ct.v = 3) q GROUP BY q.key HAVING count(*) > 14")
    a, ts = targets(conn, sql, {"ct": "g", "cd": "k"})
    plain = capture(conn, sql, a, ts)
    pinned = a.with_schemas([(t.scope, t.alias, "public") for t in a.tables])
    assert [t.qualifier for t in a.tables] == [None, "public"]
    assert [t.schema for t in pinned.tables] == [None, "public"]   # as written
    assert [t.qualifier for t in pinned.tables] == ["public", "public"]
    assert "FROM public.ct INNER JOIN public.cd" in capture_sql(sql, pinned, ts)
    assert "FROM ct INNER JOIN public.cd" in capture_sql(sql, a, ts)
    assert capture(conn, sql, pinned, ts).parts == plain.parts
    assert a.with_schemas([(1, "elsewhere", "s")]) is a


def test_version_is_the_snapshot_of_the_capture(conn: psycopg.Connection[Any],
                                                tables: str) -> None:
    sql = "SELECT g, count(*) FROM ct GROUP BY g HAVING count(*) > $1"
    a, ts = targets(conn, sql, {"ct": "g"})
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    try:
        before = conn.execute("SELECT pg_current_snapshot()::text").fetchone()
        res = capture(conn, sql, a, ts, [100])
        assert before is not None and res.version == before[0]
        assert res.parts[0].fragments == frozenset()  # every group has exactly 100 rows
        res = capture(conn, sql, a, ts, [50])
        assert len(res.parts[0].fragments) == len({ts[0].partition.fragment_of(g)
                                                   for g in range(50)})
    finally:
        conn.execute("COMMIT")


def test_capture_errors_are_capture_errors(conn: psycopg.Connection[Any],
                                           tables: str) -> None:
    sql = "SELECT g, count(*) FROM ct GROUP BY g HAVING count(*) > $1"
    a, ts = targets(conn, sql, {"ct": "g"})
    with pytest.raises(CaptureError):
        capture(conn, sql, a, ts, ["not a number"])
    with pytest.raises(CaptureError):
        capture(conn, sql, a, [])
