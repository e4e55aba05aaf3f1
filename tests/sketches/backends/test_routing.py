"""Routing: the cost model's choices and reasons, and fallback to PostgreSQL when Spark is
refused, unavailable or fails — the caller gets the PostgreSQL result, the reason is logged."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sketches.backends.postgres import PostgresBackend
from sketches.backends.routing import RoutedBackend, make_heavy_backend
from sketches.backends.spark import SparkBackend, SparkRuntime, SparkSettings
from sketches.cost import CostSettings, Estimate, choose, estimate
from tests.sketches.backends.helpers import fragments_of, targets_for

PG = PostgresBackend()
QUERY = "SELECT r.g, sum(r.v) FROM r GROUP BY r.g HAVING sum(r.v) > 50"
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def table(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute("DROP TABLE IF EXISTS r")
    conn.execute("CREATE TABLE r AS SELECT g % 20 AS g, g AS v FROM generate_series(1, 400) g")
    conn.execute("ANALYZE r")
    return conn


# ---------------------------------------------------------------- the cost model


def test_choose_forced_and_thresholds() -> None:
    big = Estimate(5e8, 2e7, (("public", "r", 5e8),))
    small = Estimate(1e5, 2e3, (("public", "r", 1e5),))
    auto = CostSettings()
    assert choose(CostSettings(mode="postgres"), big, True, "").backend == "postgres"
    assert choose(CostSettings(mode="spark"), small, True, "").backend == "spark"
    forced = choose(CostSettings(mode="spark"), small, False, "jar missing")
    assert forced.backend == "postgres" and "jar missing" in forced.reason
    assert choose(auto, big, True, "").backend == "spark"
    low = choose(auto, small, True, "")
    assert low.backend == "postgres" and "below the Spark thresholds" in low.reason
    assert "100,000 rows" in low.reason
    cheap = choose(auto, Estimate(5e8, 10.0, ()), True, "")
    assert cheap.backend == "postgres"
    waiting = choose(auto, big, False, "SparkSession starting")
    assert waiting.backend == "postgres" and "SparkSession starting" in waiting.reason
    with pytest.raises(ValueError):
        CostSettings(mode="hadoop")


def test_estimate_uses_postgres_statistics(table: psycopg.Connection[Any]) -> None:
    est = estimate(table, [("public", "r")], "SELECT * FROM r WHERE v > $1", [3])
    assert est.rows == 400
    assert est.cost is not None and est.cost > 0
    assert estimate(table, [("public", "r")], "SELECT nonsense FROM r").cost is None


def test_auto_mode_routes_small_jobs_to_postgres(table: psycopg.Connection[Any],
                                                 spark_backend: SparkBackend) -> None:
    routed = RoutedBackend(CostSettings(), spark_backend)
    analysis, targets = targets_for(table, QUERY, 5)
    got = routed.capture(table, QUERY, analysis, targets)
    decision = routed.last_decision()
    assert decision is not None and decision.ran_on == "postgres"
    assert "below the Spark thresholds" in decision.reason
    assert fragments_of(got) == fragments_of(PG.capture(table, QUERY, analysis, targets))
    eager = RoutedBackend(CostSettings(spark_min_rows=1, spark_min_cost=0), spark_backend)
    assert fragments_of(eager.capture(table, QUERY, analysis, targets)) == fragments_of(got)
    decision = eager.last_decision()
    assert decision is not None and decision.ran_on == "spark", decision


# ---------------------------------------------------------------- fallback


@pytest.mark.slow
def test_failing_spark_job_falls_back(table: psycopg.Connection[Any],
                                      spark_runtime: SparkRuntime,
                                      caplog: pytest.LogCaptureFixture) -> None:
    broken = SparkBackend(spark_runtime, SparkSettings(
        jdbc_url="jdbc:postgresql://127.0.0.1:1/nowhere", max_partitions=2))
    routed = RoutedBackend(CostSettings(mode="spark"), broken)
    analysis, targets = targets_for(table, QUERY, 5)
    with caplog.at_level(logging.WARNING, logger="sketches.backends.routing"):
        got = routed.capture(table, QUERY, analysis, targets)
    assert fragments_of(got) == fragments_of(PG.capture(table, QUERY, analysis, targets))
    decision = routed.last_decision()
    assert decision is not None and (decision.chosen, decision.ran_on) == ("spark", "postgres")
    assert "BackendJobFailed" in decision.reason
    assert any("ran on PostgreSQL" in r.getMessage() for r in caplog.records)
    assert routed.stats()["spark_fallbacks"] == 1


def test_refused_query_falls_back(table: psycopg.Connection[Any],
                                  spark_backend: SparkBackend) -> None:
    text = "SELECT r.g, avg(r.v) FROM r GROUP BY r.g HAVING avg(r.v) > 200"
    routed = RoutedBackend(CostSettings(mode="spark"), spark_backend)
    analysis, targets = targets_for(table, text, 5)
    got = routed.capture(table, text, analysis, targets)
    assert fragments_of(got) == fragments_of(PG.capture(table, text, analysis, targets))
    decision = routed.last_decision()
    assert decision is not None and decision.ran_on == "postgres"
    assert "BackendUnsupported" in decision.reason and "avg" in decision.reason


def test_missing_jar_means_postgres(table: psycopg.Connection[Any],
                                    caplog: pytest.LogCaptureFixture) -> None:
    runtime = SparkRuntime(SparkSettings(jdbc_jar="/nonexistent/postgresql.jar"))
    with caplog.at_level(logging.WARNING, logger="sketches.backends.spark"):
        runtime.start()
        assert not runtime.wait(60)
    assert runtime.state == "failed" and "never downloaded" in runtime.reason
    assert any("JDBC driver not found" in r.getMessage() for r in caplog.records)
    routed = RoutedBackend(CostSettings(mode="spark"), SparkBackend(runtime))
    analysis, targets = targets_for(table, QUERY, 5)
    got = routed.capture(table, QUERY, analysis, targets)
    assert fragments_of(got) == fragments_of(PG.capture(table, QUERY, analysis, targets))
    decision = routed.last_decision()
    assert decision is not None and decision.ran_on == "postgres"
    assert "unavailable" in decision.reason and "JDBC driver not found" in decision.reason


BOGUS_MASTER = textwrap.dedent("""
    import json, logging, sys
    import psycopg
    from sketches.backends.routing import make_heavy_backend
    from tests.sketches.backends.helpers import fragments_of, targets_for
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    routed = make_heavy_backend("spark", {"master": "bogus-master://nowhere:1",
                                          "spark.ui.enabled": "false"}, env={})
    ok = routed.spark.runtime.wait(300)
    with psycopg.connect(sys.argv[1], autocommit=True) as conn:
        analysis, targets = targets_for(conn, sys.argv[2], 5)
        got = routed.capture(conn, sys.argv[2], analysis, targets)
    d = routed.last_decision()
    print(json.dumps({"ready": ok, "status": routed.spark.runtime.reason,
                      "fragments": fragments_of(got), "ran_on": d.ran_on,
                      "reason": d.reason}))
""")


@pytest.mark.slow
def test_bogus_master_falls_back(table: psycopg.Connection[Any], db_dsn: str) -> None:
    """In a subprocess: one SparkContext per process, and the suite's is healthy."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", BOGUS_MASTER, db_dsn, QUERY], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    analysis, targets = targets_for(table, QUERY, 5)
    assert out["fragments"] == fragments_of(PG.capture(table, QUERY, analysis, targets))
    assert out["ready"] is False and out["ran_on"] == "postgres"
    assert "SparkSession failed to start" in out["status"], out
    assert "unavailable" in out["reason"]
    assert "Spark unavailable" in proc.stderr


def test_postgres_mode_never_builds_spark() -> None:
    routed = make_heavy_backend("postgres", env={})
    assert routed.spark is None
    assert routed.stats()["spark_ready"] is False


def test_settings_from_env_and_toml() -> None:
    s = SparkSettings.from_sources(
        {"IMP_SPARK_MASTER": "spark://h:7077", "IMP_SPARK_CONF": '{"spark.executor.cores": 4}'},
        {"master": "local[2]", "spark.sql.shuffle.partitions": 8, "max_partitions": 3})
    assert s.master == "spark://h:7077" and s.max_partitions == 3
    conf = s.spark_conf()
    assert conf["spark.executor.cores"] == "4" and conf["spark.sql.shuffle.partitions"] == "8"
    assert conf["spark.jars"] == "/usr/share/java/postgresql.jar"
    with pytest.raises(ValueError):
        SparkSettings.from_sources({"IMP_SPARK_CONF": "[1]"}, None)
    with pytest.raises(ValueError):
        SparkSettings.from_sources({"IMP_SPARK_CONF": '{"executor.cores": 1}'}, None)
