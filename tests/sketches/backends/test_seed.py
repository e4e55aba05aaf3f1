"""``Pipeline.build_state(conn, seed)``: an aggregate state built by a backend in the same
snapshot seeds the incremental pipeline exactly as its own queries do, and stays exact under
maintenance; a seed of another snapshot is ignored. (The PostgreSQL backend builds the seed
here, so no Spark is needed; Spark-built seeds: test_ivm_alignment.)"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest

import pg_extensions
from sketches.backends.postgres import PostgresBackend
from sketches.ivm.plan import Options, SketchTarget, compile, state_analysis
from tests.sketches.backends.helpers import targets_for

QUERY = ("SELECT r.g, sum(r.v), min(r.v), max(r.v), count(*) FROM r GROUP BY r.g"
         " HAVING max(r.v) >= 38 OR count(*) < 20")


@pytest.fixture
def tracked(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    pg_extensions.install(conn)
    conn.execute("DROP TABLE IF EXISTS r")
    conn.execute("CREATE TABLE r (id serial PRIMARY KEY, g int, v int)")
    conn.execute("INSERT INTO r (g, v) SELECT CASE WHEN i % 17 = 0 THEN NULL ELSE i % 13 END,"
                 " CASE WHEN i % 5 = 0 THEN NULL ELSE (i * 37) % 41 END"
                 " FROM generate_series(1, 400) i")
    conn.execute("ANALYZE r")
    conn.execute("SELECT imp.track_table('r'::regclass)")
    return conn


def _pipeline(conn: psycopg.Connection[Any]) -> tuple[Any, Any, Any]:
    analysis, targets = targets_for(conn, QUERY, 6)
    pipeline = compile(analysis, [SketchTarget(t.table.index, t.column, t.partition)
                                  for t in targets], None, Options(minmax_buffer=3))
    return analysis, targets, pipeline


def test_seeded_state_equals_built_state_and_maintains(tracked: psycopg.Connection[Any],
                                                       db_dsn: str) -> None:
    analysis, targets, seeded = _pipeline(tracked)
    _, _, built = _pipeline(tracked)
    with psycopg.connect(db_dsn) as rr:
        rr.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        seed = PostgresBackend().build_state(rr, state_analysis(analysis, seeded.spec), targets,
                                             None, 3)
        assert seed.functions == tuple(a.func for a in seeded.spec.aggs)   # so it is used
        frags = seeded.build_state(rr, seed)
        expected = built.build_state(rr)
        rr.rollback()
    assert seeded.version == built.version == seed.version
    assert frags == expected
    mine, theirs = seeded.snapshot(), built.snapshot()
    assert sorted(mine["ops"]["aggregate"].pop("groups"), key=repr) == \
        sorted(theirs["ops"]["aggregate"].pop("groups"), key=repr)
    assert mine == theirs
    tracked.execute("DELETE FROM r WHERE v >= 38")
    tracked.execute("INSERT INTO r (g, v) VALUES (3, 40), (NULL, 1), (12, NULL)")
    with psycopg.connect(db_dsn) as rr:
        rr.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        seeded.maintain(rr)
        fresh = _pipeline(rr)[2]
        fresh.build_state(rr)
        rr.rollback()
    assert seeded.sketch() == fresh.sketch()


def test_seed_changes_the_state(tracked: psycopg.Connection[Any], db_dsn: str) -> None:
    """The seed really replaces the pipeline's queries: a seed without any group yields an
    empty aggregate (so the equality above is not vacuous)."""
    analysis, targets, pipeline = _pipeline(tracked)
    with psycopg.connect(db_dsn) as rr:
        rr.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        seed = PostgresBackend().build_state(rr, state_analysis(analysis, pipeline.spec), targets,
                                             None, 3)
        empty = type(seed).build(seed.version, seed.functions, seed.slots, [], [], [],
                                 "test", 0.0)
        frags = pipeline.build_state(rr, empty)
        rr.rollback()
    assert frags == (frozenset(),)
    assert pipeline.aggregate is not None and not pipeline.aggregate.groups


def test_seed_of_another_snapshot_is_ignored(tracked: psycopg.Connection[Any], db_dsn: str,
                                             caplog: pytest.LogCaptureFixture) -> None:
    analysis, targets, pipeline = _pipeline(tracked)
    _, _, built = _pipeline(tracked)
    stale = PostgresBackend().build_state(tracked, state_analysis(analysis, pipeline.spec),
                                          targets, None, 3)
    assert stale.functions == tuple(a.func for a in pipeline.spec.aggs)   # only the version
    tracked.execute("INSERT INTO r (g, v) VALUES (99, 40)")
    with psycopg.connect(db_dsn) as rr:
        rr.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        with caplog.at_level(logging.WARNING, logger="sketches.ivm.pipeline"):
            frags = pipeline.build_state(rr, stale)
        expected = built.build_state(rr)
        rr.rollback()
    assert frags == expected
    assert any("seed" in r.getMessage() and "ignored" in r.getMessage()
               for r in caplog.records)
