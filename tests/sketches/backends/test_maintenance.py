"""Sketches maintained incrementally from Spark-built state stay exact.

The aggregate operator of ``sketches.ivm`` is seeded with the state the Spark backend built
(``AggregateState.load_into``), HAVING and merge on top; then random batches of inserts,
deletes and updates run in PostgreSQL, their deltas (with fragment ids computed by PostgreSQL,
as the audit-table reader does) flow through the operators, and after every batch the
maintained sketch must equal a fresh PostgreSQL capture and the aggregate's output must equal
that of state freshly built by PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from sketches.backends.postgres import PostgresBackend
from sketches.backends.spark import SparkBackend
from sketches.capture import CaptureTarget
from sketches.ivm.expr import Cmp, Col, Const
from sketches.ivm.ops.aggregate import Aggregate, AggSpec
from sketches.ivm.ops.having import Having
from sketches.ivm.ops.merge import Merge
from sketches.ivm.ops.scan import Scan
from sketches.ivm.zset import ZSet
from tests.sketches.backends.helpers import fragments_of, targets_for

pytestmark = pytest.mark.slow

PG = PostgresBackend()
QUERY = ("SELECT r.g, sum(r.v), min(r.v), count(*) FROM r GROUP BY r.g"
         " HAVING sum(r.v) > 40")
BUFFER = 2

value = st.one_of(st.none(), st.integers(-10, 30))
group = st.one_of(st.none(), st.integers(0, 12))
batch = st.lists(st.one_of(
    st.tuples(st.just("insert"), group, value),
    st.tuples(st.just("delete"), st.integers(0, 10_000), st.none()),
    st.tuples(st.just("update"), st.integers(0, 10_000), value)), min_size=1, max_size=6)


def new_aggregate(conn: psycopg.Connection[Any]) -> Aggregate:
    def refill(key: tuple[object, ...], i: int) -> tuple[list[tuple[object, int]], bool]:
        rows = conn.execute(
            "SELECT v, count(*) FROM r WHERE g IS NOT DISTINCT FROM %s AND v IS NOT NULL"
            " GROUP BY v ORDER BY v LIMIT %s", (key[0], BUFFER + 1)).fetchall()
        return [(r[0], int(r[1])) for r in rows[:BUFFER]], len(rows) <= BUFFER

    return Aggregate((0,), (AggSpec("sum", 1), AggSpec("min", 1), AggSpec("count_star")), 1,
                     buffer_limit=BUFFER, refill=refill)


def apply(conn: psycopg.Connection[Any], target: CaptureTarget,
          ops: list[tuple[str, Any, Any]]) -> ZSet:
    """Runs the batch in PostgreSQL; returns its delta rows ``(g, v, fragment)`` ±1."""
    frag = target.partition.fragment_sql(sql.Identifier("g"))
    returning = sql.SQL(" RETURNING g, v, {}").format(frag)
    delta = ZSet()
    ids = [r[0] for r in conn.execute("SELECT id FROM r ORDER BY id").fetchall()]
    for kind, a, b in ops:
        if kind == "insert":
            rows = conn.execute(sql.SQL("INSERT INTO r (g, v) VALUES (%s, %s)") + returning,
                                (a, b)).fetchall()
            delta.extend(ZSet((tuple(r), (), 1) for r in rows))
            continue
        if not ids:
            continue
        victim = ids[a % len(ids)]
        rows = conn.execute(sql.SQL("DELETE FROM r WHERE id = %s") + returning,
                            (victim,)).fetchall()
        ids.remove(victim)
        for r in rows:
            delta.add(tuple(r), (), -1)
            if kind == "update":
                new = conn.execute(sql.SQL("INSERT INTO r (g, v) VALUES (%s, %s)") + returning,
                                   (r[0], b)).fetchall()
                delta.extend(ZSet((tuple(n), (), 1) for n in new))
    return delta


@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(initial=st.lists(st.tuples(group, value), max_size=60),
       batches=st.lists(batch, min_size=1, max_size=4), fragments=st.integers(2, 8))
def test_maintained_after_spark_capture_stays_exact(
        conn: psycopg.Connection[Any], spark_backend: SparkBackend,
        initial: list[tuple[object, object]], batches: list[list[tuple[str, Any, Any]]],
        fragments: int) -> None:
    conn.execute("DROP TABLE IF EXISTS r")
    conn.execute("CREATE TABLE r (id serial PRIMARY KEY, g int, v int)")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO r (g, v) VALUES (%s, %s)", initial)
    conn.execute("ANALYZE r")
    analysis, targets = targets_for(conn, QUERY, fragments)

    state = spark_backend.build_state(conn, analysis, targets, None, BUFFER)
    assert state.same_as(PG.build_state(conn, analysis, targets, None, BUFFER))
    agg = new_aggregate(conn)
    state.load_into(agg)
    scan = Scan(1, 0, 2)
    having = Having(Cmp(">", Col(1), Const(40)))
    merge = Merge(1)
    merge.step(having.step(agg.current_output()))
    captured = spark_backend.capture(conn, QUERY, analysis, targets)
    assert [sorted(s) for s in merge.sketch()] == fragments_of(captured)

    for ops in batches:
        delta = apply(conn, targets[0], ops)
        merge.step(having.step(agg.step(scan.step(delta))))
        fresh = PG.capture(conn, QUERY, analysis, targets)
        assert [sorted(s) for s in merge.sketch()] == fragments_of(fresh)
        rebuilt = new_aggregate(conn)
        PG.build_state(conn, analysis, targets, None, BUFFER).load_into(rebuilt)
        assert agg.current_output() == rebuilt.current_output()
