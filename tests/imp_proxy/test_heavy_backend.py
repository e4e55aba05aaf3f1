"""The heavy backend through the real proxy (issue 5): ``--heavy-backend`` / IMP_HEAVY_BACKEND /
TOML ``heavy_backend`` and the ``[spark]`` table, the choice in ``IMP EXPLAIN`` and
``IMP SHOW STATS``, exact answers when Spark is broken (fallback to PostgreSQL, Spark never
started on the request path in auto mode), and one capture by a working local Spark."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from imp_proxy.cli import make_backend
from imp_proxy.config import ConfigError, load_config

from .conftest import ProxyProcess, launch_proxy, via_proxy

pytest.importorskip("sketches.manager")

ROOT = Path(__file__).resolve().parents[2]
HAVING = "SELECT g, count(*) AS n, max(v) AS m FROM hbt GROUP BY g HAVING max(v) >= %s"
TOPK = "SELECT g, sum(v) AS s FROM hbt GROUP BY g ORDER BY s DESC, g LIMIT 3"
QUERIES: tuple[tuple[str, tuple[object, ...]], ...] = ((HAVING, (996,)), (HAVING, (990,)),
                                                       (TOPK, ()))
# Python-side literal of HAVING for IMP EXPLAIN (no parameters there)
EXPLAINED = HAVING.replace("%s", "996")


# ---------------------------------------------------------------- configuration


def test_heavy_backend_precedence(tmp_path: Path) -> None:
    assert load_config({}, env={}).heavy_backend == "auto"
    toml = tmp_path / "imp.toml"
    toml.write_text('heavy_backend = "spark"\n')
    env = {"IMP_CONFIG": str(toml)}
    assert load_config({}, env=env).heavy_backend == "spark"
    env["IMP_HEAVY_BACKEND"] = "postgres"
    assert load_config({}, env=env).heavy_backend == "postgres"
    assert load_config({"heavy_backend": "auto"}, env=env).heavy_backend == "auto"
    assert load_config({"heavy_backend": None}, env=env).heavy_backend == "postgres"
    with pytest.raises(ConfigError, match="heavy_backend"):
        load_config({}, env={"IMP_HEAVY_BACKEND": "hadoop"})
    toml.write_text('heavy_backend = "mapreduce"\n')
    with pytest.raises(ConfigError, match="auto, postgres, spark"):
        load_config({}, env={"IMP_CONFIG": str(toml)})


def test_spark_table(tmp_path: Path) -> None:
    toml = tmp_path / "imp.toml"
    toml.write_text('[spark]\nmaster = "local[2]"\nspark_min_rows = 1000\nspark_min_cost = 0\n'
                    'max_partitions = 3\nspark.sql.shuffle.partitions = 4\n'
                    '"spark.ui.enabled" = false\n[spark.conf]\n"spark.executor.cores" = 2\n')
    cfg = load_config({}, env={"IMP_CONFIG": str(toml)})
    assert dict(cfg.spark) == {"master": "local[2]", "spark_min_rows": "1000",
                               "spark_min_cost": "0", "max_partitions": "3",
                               "spark.sql.shuffle.partitions": "4",
                               "spark.ui.enabled": "false", "spark.executor.cores": "2"}
    backend = make_backend("auto", cfg.spark)
    assert backend.spark is not None
    assert (backend.cost.spark_min_rows, backend.cost.spark_min_cost) == (1000.0, 0.0)
    assert backend.spark.settings.master == "local[2]"
    assert backend.spark.settings.max_partitions == 3
    conf = backend.spark.settings.spark_conf()
    assert conf["spark.sql.shuffle.partitions"] == "4" and conf["spark.executor.cores"] == "2"
    assert backend.spark.runtime.state == "stopped"  # auto mode: nothing started
    assert make_backend("postgres", cfg.spark).spark is None
    toml.write_text('[spark]\nmastr = "local[2]"\n')
    with pytest.raises(ConfigError, match="unknown \\[spark\\] setting 'mastr'"):
        load_config({}, env={"IMP_CONFIG": str(toml)})
    toml.write_text('[spark]\nspark_min_rows = "lots"\n')
    with pytest.raises(ConfigError, match="spark_min_rows"):
        load_config({}, env={"IMP_CONFIG": str(toml)})


def test_help_and_bad_flag() -> None:
    out = subprocess.run([sys.executable, "-m", "imp_proxy", "serve", "--help"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert "--heavy-backend {auto,postgres,spark}" in out and "IMP_HEAVY_BACKEND" in out
    bad = subprocess.run([sys.executable, "-m", "imp_proxy", "serve", "--heavy-backend",
                          "hadoop"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


# ---------------------------------------------------------------- through the proxy


@pytest.fixture(scope="module")
def data(db_dsn: str) -> str:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE hbt (id int PRIMARY KEY, g int, v int)"
                  " WITH (autovacuum_enabled = false)")
        c.execute("INSERT INTO hbt SELECT i, i % 60, (i * 37) % 1000 FROM"
                  " generate_series(1, 6000) i ORDER BY i % 60")
        c.execute("ANALYZE hbt")
    return db_dsn


@pytest.fixture
def launch(admin_dsn: str, tmp_path: Path) -> Iterator[Callable[..., ProxyProcess]]:
    started: list[ProxyProcess] = []

    def start(*args: str, toml: str | None = None, timeout: float = 60.0) -> ProxyProcess:
        extra = ["--library-setting", "fragments=20", *args]
        if toml is not None:
            path = tmp_path / f"imp-{len(started)}.toml"
            path.write_text(toml)
            extra += ["--config", str(path)]
        p = launch_proxy(admin_dsn, *extra, timeout=timeout)
        started.append(p)
        return p

    try:
        yield start
    finally:
        for p in started:
            p.stop()


def key_values(dsn: str, statement: str) -> dict[str, str | None]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return {str(k): v for k, v in c.execute(statement.encode()).fetchall()}


def rows(dsn: str, sql: str, params: tuple[object, ...]) -> Counter[Any]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return Counter(c.execute(sql.encode() if not params else sql, params).fetchall())


def pg_jobs(stats: dict[str, str | None]) -> int:
    """Captures and state builds that ran on PostgreSQL (RoutedBackend counters)."""
    return sum(int(str(stats.get(k) or 0)) for k in ("capture_postgres", "build_state_postgres"))


def drop_sketches(proxied: str) -> None:
    """Forget the sketches (and states) an earlier test's proxy persisted: captures again."""
    with psycopg.connect(proxied, autocommit=True) as c:
        c.execute(b"IMP DROP ALL SKETCHES")


def assert_exact(proxied: str, direct: str, rounds: int = 2) -> None:
    for _ in range(rounds):
        for sql, params in QUERIES:
            assert rows(proxied, sql, params) == rows(direct, sql, params), sql


def test_forced_postgres_and_default_show_the_choice(data: str, launch: Callable[...,
                                                     ProxyProcess]) -> None:
    forced = launch("--heavy-backend", "postgres")
    proxied = via_proxy(data, forced.port)
    drop_sketches(proxied)
    assert_exact(proxied, data)
    plan = key_values(proxied, f"IMP EXPLAIN {EXPLAINED}")
    assert plan["decision"] == "use" and plan["instrumented_sql"] is not None
    assert (plan["heavy_backend"], plan["heavy_backend_reason"]) == (
        "postgres", "heavy backend forced to postgres")
    stats = key_values(proxied, "IMP SHOW STATS")
    assert stats["heavy_backend"] == "postgres" and stats["spark_ready"] == "false"
    assert pg_jobs(stats) >= 1, stats
    assert "heavy backend: postgres" in forced.log_text()

    default = launch()
    proxied = via_proxy(data, default.port)
    drop_sketches(proxied)
    assert_exact(proxied, data)
    plan = key_values(proxied, f"IMP EXPLAIN {EXPLAINED}")
    assert plan["heavy_backend"] == "postgres"
    assert "below the Spark thresholds" in str(plan["heavy_backend_reason"])
    assert "~6,000 rows" in str(plan["heavy_backend_reason"])
    stats = key_values(proxied, "IMP SHOW STATS")
    # auto mode never started Spark: not for IMP EXPLAIN, not for the captures
    assert (stats["heavy_backend"], stats["spark_ready"], stats["spark_status"]) == (
        "auto", "false", "not started")
    assert "spark_fallbacks" not in stats
    assert "below the Spark thresholds" in str(stats["heavy_backend_last"])


def test_forced_spark_with_a_broken_configuration_answers_exactly(
        data: str, launch: Callable[..., ProxyProcess]) -> None:
    """A missing JDBC driver jar: the Spark session never becomes ready, every job falls back
    to PostgreSQL, the reason is in IMP SHOW STATS, IMP EXPLAIN and the log."""
    p = launch("--heavy-backend", "spark",
               toml='[spark]\njdbc_jar = "/nonexistent/imp/postgresql.jar"\n')
    proxied = via_proxy(data, p.port)
    deadline = time.monotonic() + 60
    while key_values(proxied, "IMP SHOW STATS")["spark_status"] == "SparkSession starting":
        assert time.monotonic() < deadline, "the Spark start did not fail"
        time.sleep(0.2)
    drop_sketches(proxied)
    assert_exact(proxied, data, rounds=3)
    stats = key_values(proxied, "IMP SHOW STATS")
    assert (stats["heavy_backend"], stats["spark_ready"]) == ("spark", "false")
    assert "JDBC driver not found at /nonexistent/imp/postgresql.jar" in str(
        stats["spark_status"])
    # the table is tracked by now: captures build the incremental state (build_state jobs)
    assert pg_jobs(stats) >= 1, stats
    assert "unavailable" in str(stats["heavy_backend_last"])
    plan = key_values(proxied, f"IMP EXPLAIN {EXPLAINED}")
    assert plan["heavy_backend"] == "postgres"
    assert "forced to spark, but Spark is unavailable" in str(plan["heavy_backend_reason"])
    log = p.log_text()
    assert "Spark unavailable: PostgreSQL JDBC driver not found" in log
    assert "Traceback" not in log


@pytest.mark.slow
def test_forced_spark_captures_with_local_spark(data: str, launch: Callable[...,
                                                ProxyProcess]) -> None:
    """A working local[2] Spark: once its session is ready (started in the background at
    proxy start), captures and state builds run on Spark and answer exactly."""
    pytest.importorskip("pyspark")
    p = launch("--heavy-backend", "spark", toml=(
        '[spark]\nmaster = "local[2]"\nmax_partitions = 3\n'
        '"spark.sql.shuffle.partitions" = "4"\n"spark.default.parallelism" = "2"\n'
        '"spark.driver.memory" = "1g"\n'))
    proxied = via_proxy(data, p.port)
    deadline = time.monotonic() + 400
    while True:
        stats = key_values(proxied, "IMP SHOW STATS")
        if stats["spark_ready"] == "true":
            break
        assert stats["spark_status"] == "SparkSession starting", stats["spark_status"]
        assert time.monotonic() < deadline, "SparkSession did not start in time"
        time.sleep(1.0)
    plan = key_values(proxied, f"IMP EXPLAIN {EXPLAINED}")
    assert (plan.get("heavy_backend"), plan.get("heavy_backend_reason")) == (
        "spark", "heavy backend forced to spark"), plan
    drop_sketches(proxied)
    assert_exact(proxied, data, rounds=3)
    with psycopg.connect(data, autocommit=True) as c:  # a direct writer: maintenance
        c.execute("UPDATE hbt SET v = 999 WHERE id IN (7, 8)")
        c.execute("DELETE FROM hbt WHERE id = 9")
    assert_exact(proxied, data, rounds=2)
    stats = key_values(proxied, "IMP SHOW STATS")
    spark_jobs = sum(int(str(stats.get(k) or 0)) for k in ("capture_spark", "build_state_spark"))
    assert spark_jobs >= 1, stats
    assert int(str(stats.get("spark_fallbacks") or 0)) == 0, stats
