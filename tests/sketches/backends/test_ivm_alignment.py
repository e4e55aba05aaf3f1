"""The state the backends build is the state the incremental engine builds.

``sketches.ivm.pipeline.Pipeline.build_state`` fills its aggregate operator with its own
PostgreSQL queries; an equally configured ``Aggregate`` seeded from the Spark backend's
``AggregateState`` (``load_into``) must end up with an identical ``snapshot()``, and the
pipeline's sketch must equal the Spark capture — the contract behind the one-line hook
``backend.spark_state(…).load_into(pipeline.aggregate)``.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import pg_extensions
from sketches.backends.routing import RoutedBackend
from sketches.backends.spark import SparkBackend
from sketches.cost import CostSettings
from sketches.ivm.ops.aggregate import Aggregate
from sketches.ivm.plan import Options, SketchTarget, compile, state_analysis
from tests.sketches.backends.helpers import fragments_of, targets_for

pytestmark = pytest.mark.slow

CASES = (
    "SELECT r.g, sum(r.v), min(r.v), max(r.t), avg(r.v), count(*) FROM r GROUP BY r.g"
    " HAVING sum(r.v) > 100 OR count(*) < 3",
    "SELECT r.g, s.region, count(r.v), max(s.label) FROM r JOIN s ON r.g = s.x"
    " WHERE s.region < 2 GROUP BY r.g, s.region HAVING count(r.v) > 4",
    "SELECT r.g, sum(r.v) AS sv FROM r GROUP BY r.g ORDER BY sv DESC NULLS LAST, r.g LIMIT 3",
    # min/max maintained as counts (Options.minmax_counts): Spark counts what PostgreSQL's
    # pushed-down read evaluated
    "SELECT r.g, max(r.v) FROM r GROUP BY r.g HAVING max(r.v) >= 30 OR min(r.v) > 5",
)


@pytest.fixture
def tracked(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    pg_extensions.install(conn)
    conn.execute("DROP TABLE IF EXISTS r, s")
    conn.execute("CREATE TABLE r (id serial PRIMARY KEY, g int, t text, v int)")
    conn.execute("INSERT INTO r (g, t, v) SELECT CASE WHEN i % 17 = 0 THEN NULL ELSE i % 13 END,"
                 " 'k' || (i % 7), CASE WHEN i % 5 = 0 THEN NULL ELSE (i * 37) % 41 END"
                 " FROM generate_series(1, 400) i")
    conn.execute("CREATE TABLE s (x int, region int, label text)")
    conn.execute("INSERT INTO s SELECT x, x % 3, 'l' || (x % 4) FROM generate_series(0, 12) x")
    conn.execute("ANALYZE r")
    conn.execute("ANALYZE s")
    for table in ("r", "s"):
        conn.execute("SELECT imp.track_table(%s::regclass)", (table,))
    return conn


@pytest.mark.parametrize("text", CASES)
def test_spark_state_seeds_the_pipeline_identically(tracked: psycopg.Connection[Any],
                                                    db_dsn: str, spark_backend: SparkBackend,
                                                    text: str) -> None:
    analysis, targets = targets_for(tracked, text, 5)
    options = Options(minmax_buffer=3)
    pipeline = compile(analysis, [SketchTarget(t.table.index, t.column, t.partition)
                                  for t in targets], None, options)
    routed = RoutedBackend(CostSettings(mode="spark"), spark_backend)
    with psycopg.connect(db_dsn) as rr:
        rr.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        frags = pipeline.build_state(rr)
        state = routed.spark_state(rr, state_analysis(analysis, pipeline.spec), targets, None,
                                   options.minmax_buffer)
        captured = spark_backend.capture(rr, text, analysis, targets)
        rr.rollback()
    assert state is not None and state.version == pipeline.version
    if "HAVING max" in text:
        assert {a.func for a in pipeline.spec.aggs} == {"count"}
    decision = routed.last_decision()
    assert decision is not None and decision.ran_on == "spark"
    built = pipeline.aggregate
    assert built is not None
    seeded = Aggregate(built.group_by, built.aggs, built.slots, scalar=built.scalar,
                       buffer_limit=built.buffer_limit)
    state.load_into(seeded)
    mine, theirs = seeded.snapshot(), built.snapshot()
    groups_mine, groups_theirs = mine.pop("groups"), theirs.pop("groups")
    assert mine == theirs
    assert sorted(groups_mine, key=repr) == sorted(groups_theirs, key=repr)  # dict order aside
    assert len(groups_mine) > 3
    assert [sorted(f) for f in frags] == fragments_of(captured)


def test_spark_state_declines_without_spark(tracked: psycopg.Connection[Any],
                                            spark_backend: SparkBackend) -> None:
    analysis, targets = targets_for(tracked, CASES[0], 5)
    assert RoutedBackend(CostSettings(mode="postgres"), spark_backend).spark_state(
        tracked, analysis, targets) is None
    auto = RoutedBackend(CostSettings(), spark_backend)
    assert auto.spark_state(tracked, analysis, targets) is None
    decision = auto.last_decision()
    assert decision is not None and "below the Spark thresholds" in decision.reason
