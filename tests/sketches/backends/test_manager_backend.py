"""SketchManager with a heavy backend (the proxy's wiring): captures and state builds go through
``RoutedBackend``, the choice shows in ``stats()`` and ``explain_backend()``, and auto mode
never starts Spark for jobs below the thresholds. No Spark session is needed here (the Spark
backend of these managers is never ready); Spark-run jobs: test_ivm_alignment, test_routing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from sketches import catalog
from sketches.backends.routing import RoutedBackend, make_heavy_backend
from sketches.backends.spark import SparkBackend, SparkRuntime, SparkSettings
from sketches.cost import CostSettings
from sketches.manager import Prepared, SketchManager, SketchSettings

HAVING = "SELECT g, count(*) AS c FROM hb WHERE v >= 0 GROUP BY g HAVING count(*) > $1"


@pytest.fixture(scope="module")
def data(db_dsn: str) -> str:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        catalog.ensure_installed(conn)
        conn.execute("CREATE TABLE hb WITH (autovacuum_enabled = false) AS SELECT i AS id,"
                     " i % 200 AS g, (i * 37) % 101 AS v FROM generate_series(1, 20000) i")
        conn.execute("INSERT INTO hb SELECT 100000 + i, 7, 1 FROM generate_series(1, 500) i")
        conn.execute("ANALYZE hb")
    return db_dsn


@pytest.fixture
def svc(data: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(data, autocommit=True) as c:
        yield c


def prepare(m: SketchManager, svc: psycopg.Connection[Any], params: list[Any]) -> Prepared:
    svc.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    try:
        return m.prepare(svc, HAVING, params)
    finally:
        svc.execute("COMMIT")


def rows(conn: psycopg.Connection[Any], sql: str, params: list[Any]) -> Counter[Any]:
    with psycopg.RawCursor(conn) as cur:
        cur.execute(sql, params)
        return Counter(cur.fetchall())


def never_started() -> SparkBackend:
    """A Spark backend whose session is never started by these tests (a bogus master: if
    anything did start it, the state would leave "stopped")."""
    return SparkBackend(SparkRuntime(SparkSettings(master="spark://127.0.0.1:1")))


def test_forced_postgres_captures_through_the_backend(svc: psycopg.Connection[Any]) -> None:
    backend = make_heavy_backend("postgres", env={})
    m = SketchManager(SketchSettings(fragments=50, persist=False, strategy="recapture"),
                      backend=backend)
    p = prepare(m, svc, [100])
    assert p.decision == "capture" and p.instrumented_sql is not None
    assert rows(svc, p.instrumented_sql, [100]) == rows(svc, HAVING, [100])
    stats = m.stats()
    assert stats["heavy_backend"] == "postgres" and stats["capture_postgres"] == 1
    assert "forced to postgres" in str(stats["heavy_backend_last"])
    svc.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    explained = dict(m.explain_backend(svc, HAVING, [100]))
    svc.execute("COMMIT")
    assert explained == {"heavy_backend": "postgres",
                         "heavy_backend_reason": "heavy backend forced to postgres"}


def test_auto_keeps_small_jobs_on_postgres_without_starting_spark(
        svc: psycopg.Connection[Any]) -> None:
    spark = never_started()
    backend = RoutedBackend(CostSettings(), spark)
    m = SketchManager(SketchSettings(fragments=50, persist=False), backend=backend)
    try:
        for n in (100, 100, 90):
            p = prepare(m, svc, [n])
            assert p.instrumented_sql is not None
            assert rows(svc, p.instrumented_sql, [n]) == rows(svc, HAVING, [n])
        svc.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        explained = dict(m.explain_backend(svc, HAVING, [100]))
        svc.execute("COMMIT")
    finally:
        m.close()
    assert explained["heavy_backend"] == "postgres"
    assert "below the Spark thresholds" in str(explained["heavy_backend_reason"])
    assert spark.runtime.state == "stopped"
    stats = m.stats()
    assert stats["heavy_backend"] == "auto" and stats["spark_ready"] is False
    assert stats["capture_postgres"] >= 1 and "spark_fallbacks" not in stats


def test_forced_spark_unavailable_falls_back_exactly(svc: psycopg.Connection[Any]) -> None:
    """Forced Spark whose session failed: every job runs on PostgreSQL, answers stay exact,
    the reason is in stats (no Spark needed: the runtime is marked failed directly)."""
    spark = SparkBackend(SparkRuntime(SparkSettings(jdbc_jar="/nonexistent/postgresql.jar")))
    spark.runtime.start()
    assert not spark.runtime.wait(60)
    m = SketchManager(SketchSettings(fragments=50, persist=False, strategy="recapture"),
                      backend=RoutedBackend(CostSettings(mode="spark"), spark))
    p = prepare(m, svc, [95])
    assert p.instrumented_sql is not None
    assert rows(svc, p.instrumented_sql, [95]) == rows(svc, HAVING, [95])
    stats = m.stats()
    assert stats["capture_postgres"] == 1 and stats["spark_ready"] is False
    assert "JDBC driver not found" in str(stats["spark_status"])
    assert "unavailable" in str(stats["heavy_backend_last"])
