"""One SparkSession (local[2], 4 shuffle partitions) for the whole test session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sketches.backends.spark import SparkBackend, SparkRuntime, SparkSettings

TEST_CONF = (("spark.sql.shuffle.partitions", "4"), ("spark.default.parallelism", "2"),
             ("spark.driver.memory", "1g"))


@pytest.fixture(scope="session")
def spark_runtime() -> Iterator[SparkRuntime]:
    pytest.importorskip("pyspark")
    runtime = SparkRuntime(SparkSettings(master="local[2]", conf=TEST_CONF, max_partitions=3))
    runtime.start()
    if not runtime.wait(180):
        pytest.fail(f"SparkSession did not start: {runtime.reason}")
    try:
        yield runtime
    finally:
        runtime.stop()


@pytest.fixture(scope="session")
def spark_backend(spark_runtime: SparkRuntime) -> SparkBackend:
    return SparkBackend(spark_runtime)
