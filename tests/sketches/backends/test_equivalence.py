"""Spark and PostgreSQL produce identical sketches and identical aggregate state.

Random data (ints with skew and NULLs, text, dates, numeric, a second table to join), a fixed
set of query templates with random parameters, random fragment counts and buffer limits.
Every Spark job costs ~0.5–1 s on local[2], so hypothesis runs few examples.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sketches.backends.base import BackendJobFailed, BackendUnsupported, MatchRequest
from sketches.backends.postgres import PostgresBackend
from sketches.backends.spark import SparkBackend
from sketches.errors import CaptureError
from tests.sketches.backends.helpers import fragments_of, targets_for

pytestmark = pytest.mark.slow

PG = PostgresBackend()

QUERIES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("having-int",
     "SELECT r.g, sum(r.v) AS sv, count(*) FROM r GROUP BY r.g HAVING sum(r.v) > $1",
     ("threshold",)),
    ("having-text",
     "SELECT r.t, min(r.d), max(r.w), count(r.v), avg(r.v) FROM r WHERE r.v > $1"
     " GROUP BY r.t HAVING count(*) >= $2 AND min(r.v) IS NOT NULL", ("low", "count")),
    ("topk-date",
     "SELECT r.d, sum(r.w) AS sw FROM r GROUP BY r.d ORDER BY sw DESC NULLS LAST, r.d"
     " LIMIT $1", ("k",)),
    ("join",
     "SELECT r.g, s.region, sum(r.v), max(s.label) FROM r JOIN s ON r.g = s.x"
     " WHERE s.region < 2 GROUP BY r.g, s.region HAVING sum(r.v) > $1 OR count(*) > $2",
     ("threshold", "count")),
    ("topk-rows", "SELECT r.id, r.v FROM r ORDER BY r.v DESC, r.id LIMIT $1", ("k",)),
    ("distinct", "SELECT DISTINCT r.t FROM r WHERE r.v < $1", ("low",)),
)

row = st.tuples(
    st.one_of(st.none(), st.integers(0, 6), st.integers(0, 40)),       # g: skewed, NULLs
    st.one_of(st.none(), st.sampled_from(["", "a", "ab", "b", "ba", "z", "Ä", "a b"])),
    st.one_of(st.none(), st.dates(dt.date(2020, 1, 1), dt.date(2020, 3, 1))),
    st.one_of(st.none(), st.integers(-50, 100)),                         # v
    st.one_of(st.none(), st.decimals(-100, 100, places=2, allow_nan=False)),
)


def load(conn: psycopg.Connection[Any], rows: list[tuple[object, ...]], s_rows: int) -> None:
    conn.execute("DROP TABLE IF EXISTS r, s")
    conn.execute("CREATE TABLE r (id serial PRIMARY KEY, g int, t text, d date, v int,"
                 " w numeric(10,2))")
    conn.execute("CREATE TABLE s (x int, region int, label text)")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO r (g, t, d, v, w) VALUES (%s, %s, %s, %s, %s)", rows)
        cur.executemany("INSERT INTO s VALUES (%s, %s, %s)",
                        [(x, x % 3, f"l{x % 5}") for x in range(s_rows)])
    conn.execute("ANALYZE r")
    conn.execute("ANALYZE s")


@settings(max_examples=3, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(row, min_size=0, max_size=120),
       s_rows=st.integers(0, 30),
       fragments=st.integers(2, 9),
       threshold=st.integers(-50, 300), low=st.integers(-20, 60), count=st.integers(1, 6),
       k=st.integers(1, 6), buffer=st.sampled_from([None, 1, 2]))
def test_same_sketch_and_state(conn: psycopg.Connection[Any], spark_backend: SparkBackend,
                               rows: list[tuple[object, ...]], s_rows: int, fragments: int,
                               threshold: int, low: int, count: int, k: int,
                               buffer: int | None) -> None:
    load(conn, rows, s_rows)
    values = {"threshold": threshold, "low": low, "count": count, "k": k}
    for name, text, names in QUERIES:
        analysis, targets = targets_for(conn, text, fragments)
        bound = tuple(values[n] for n in names)
        expected = PG.capture(conn, text, analysis, targets, bound)
        got = spark_backend.capture(conn, text, analysis, targets, bound)
        assert fragments_of(got) == fragments_of(expected), name
        if analysis.is_aggregate or analysis.distinct:
            s_pg = PG.build_state(conn, analysis, targets, bound, buffer)
            s_spark = spark_backend.build_state(conn, analysis, targets, bound, buffer)
            assert s_spark.same_as(s_pg), (name, s_pg, s_spark)


def test_types_come_back_as_postgres_returns_them(conn: psycopg.Connection[Any],
                                                  spark_backend: SparkBackend) -> None:
    load(conn, [(1, "a", dt.date(2020, 1, 2), 5, Decimal("1.50")),
                (1, "b", dt.date(2020, 1, 3), 7, Decimal("2.25")),
                (2, None, None, None, None)], 3)
    conn.execute("ALTER TABLE r ADD COLUMN big bigint")
    conn.execute("UPDATE r SET big = v * 1000000000000")
    text = ("SELECT r.g, sum(r.big), sum(r.w), sum(r.v), min(r.t), max(r.d) FROM r"
            " GROUP BY r.g")
    analysis, targets = targets_for(conn, text, 4)
    s_pg = PG.build_state(conn, analysis, targets)
    s_spark = spark_backend.build_state(conn, analysis, targets)
    assert s_spark.same_as(s_pg)
    partial = next(p for p in s_spark.partials if p.key == (1,))
    assert partial.partials[0] == (Decimal(12000000000000), 2)
    assert isinstance(partial.partials[0][0], Decimal)   # sum(bigint) is numeric
    assert str(partial.partials[1][0]) == "3.75"
    assert partial.partials[2] == (12, 2) and isinstance(partial.partials[2][0], int)


def test_spark_reads_the_callers_snapshot(conn: psycopg.Connection[Any], db_dsn: str,
                                          spark_backend: SparkBackend) -> None:
    load(conn, [(g, "x", None, 10, None) for g in range(10)], 0)
    text = "SELECT r.g, sum(r.v) FROM r GROUP BY r.g HAVING sum(r.v) > 15"
    analysis, targets = targets_for(conn, text, 5)
    with psycopg.connect(db_dsn) as reader:
        reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        before = PG.capture(reader, text, analysis, targets)
        assert fragments_of(before) == [[]]
        with psycopg.connect(db_dsn, autocommit=True) as writer:
            writer.execute("INSERT INTO r (g, v) SELECT g, 100 FROM generate_series(0, 9) g")
        got = spark_backend.capture(reader, text, analysis, targets)
        assert fragments_of(got) == [[]]
        assert got.version == before.version
        reader.rollback()
    after = spark_backend.capture(conn, text, analysis, targets)
    assert fragments_of(after) == fragments_of(PG.capture(conn, text, analysis, targets))
    assert fragments_of(after) != [[]]


def test_full_maintenance_and_match_rows(conn: psycopg.Connection[Any],
                                         spark_backend: SparkBackend) -> None:
    load(conn, [(g % 7, f"t{g % 4}", None, g, None) for g in range(200)], 20)
    text = "SELECT r.g, sum(r.v), min(r.v) FROM r GROUP BY r.g HAVING sum(r.v) > 2900"
    analysis, targets = targets_for(conn, text, 6)
    pg = PG.full_maintenance(conn, text, analysis, targets, None, 3)
    sp = spark_backend.full_maintenance(conn, text, analysis, targets, None, 3)
    assert fragments_of(sp.capture) == fragments_of(pg.capture) != [[]]
    assert sp.state.same_as(pg.state)
    _, s_targets = targets_for(conn, "SELECT s.x, count(*) FROM s GROUP BY s.x", 4)
    request = MatchRequest("public", "s", ("x", "label"), ("x",), s_targets[0])
    keys = [(1,), (3,), (3,), (17,), (99,), (None,)]
    assert sorted(spark_backend.match_rows(conn, request, keys)) == \
        sorted(PG.match_rows(conn, request, keys))
    assert len(PG.match_rows(conn, request, keys)) == 3


def test_ties_at_the_kth_row_span_fragments(conn: psycopg.Connection[Any],
                                            spark_backend: SparkBackend) -> None:
    """Rows tied with the k-th one live in many fragments: all of them are provenance."""
    load(conn, [(g, None, None, 10 if g % 3 else 1, None) for g in range(60)], 0)
    for text in ("SELECT r.g, sum(r.v) AS sv FROM r GROUP BY r.g ORDER BY sv LIMIT 2",
                 "SELECT r.g, sum(r.v) AS sv FROM r GROUP BY r.g ORDER BY sv DESC LIMIT 2"):
        analysis, targets = targets_for(conn, text, 8)
        expected = PG.capture(conn, text, analysis, targets)
        got = spark_backend.capture(conn, text, analysis, targets)
        assert fragments_of(got) == fragments_of(expected)
        assert len(fragments_of(expected)[0]) >= 2, text


def test_timestamps_varchar_and_refused_types(conn: psycopg.Connection[Any],
                                              spark_backend: SparkBackend) -> None:
    conn.execute("DROP TABLE IF EXISTS ts")
    conn.execute("CREATE TABLE ts (k varchar(8), at timestamp, r real, c char(3))")
    conn.execute("INSERT INTO ts SELECT 'k' || (i % 5), timestamp '2021-03-28 00:30:00'"
                 " + i * interval '17 minutes 3.25 seconds', i / 3.0, 'x' FROM"
                 " generate_series(1, 200) i")
    conn.execute("ANALYZE ts")
    for text in ("SELECT ts.k, max(ts.at), min(ts.at), count(*) FROM ts GROUP BY ts.k",
                 "SELECT ts.at, count(*) FROM ts GROUP BY ts.at HAVING count(*) >= 1"):
        analysis, targets = targets_for(conn, text, 4)
        assert spark_backend.capture(conn, text, analysis, targets).parts == \
            PG.capture(conn, text, analysis, targets).parts
        assert spark_backend.build_state(conn, analysis, targets, None, 3).same_as(
            PG.build_state(conn, analysis, targets, None, 3))
    for text in ("SELECT ts.k, sum(ts.r) FROM ts GROUP BY ts.k",
                 "SELECT ts.c, count(*) FROM ts GROUP BY ts.c"):
        analysis, targets = targets_for(conn, text, 4)
        with pytest.raises(BackendUnsupported):
            spark_backend.build_state(conn, analysis, targets)


def test_spark_reads_constants_as_the_caller_does(conn: psycopg.Connection[Any],
                                                  spark_backend: SparkBackend) -> None:
    """The JDBC connections take the caller's TimeZone and DateStyle: a date compared with a
    timestamptz, or with a date written day first, means what it means on the caller's
    connection (pgjdbc starts its sessions in the JVM's TimeZone, DateStyle ISO)."""
    load(conn, [(g, "x", dt.date(2020, 1, 1) + dt.timedelta(days=g * 37 % 70), g % 7, None)
                for g in range(140)], 0)   # adjacent dates in distant groups
    texts = ["SELECT r.g, sum(r.v) FROM r WHERE r.d < '2020-01-02 00:00+00'::timestamptz"
             " GROUP BY r.g HAVING sum(r.v) >= 0",
             "SELECT r.g, sum(r.v) FROM r WHERE r.d < '03/01/2020' GROUP BY r.g"
             " HAVING sum(r.v) >= 0"]
    seen: list[list[list[int]]] = []
    conn.execute("SET TimeZone = 'Pacific/Kiritimati'")
    conn.execute("SET DateStyle = 'SQL, DMY'")
    try:
        for text in texts:
            analysis, targets = targets_for(conn, text, 8)
            expected = PG.capture(conn, text, analysis, targets)
            got = spark_backend.capture(conn, text, analysis, targets)
            assert fragments_of(got) == fragments_of(expected), text
            seen.append(fragments_of(expected))
    finally:
        conn.execute("RESET TimeZone")
        conn.execute("RESET DateStyle")
    for text, caller in zip(texts, seen, strict=True):   # the settings matter to these
        analysis, targets = targets_for(conn, text, 8)
        assert fragments_of(PG.capture(conn, text, analysis, targets)) != caller, text


@pytest.mark.parametrize("clause", ["HAVING max(fo.f) * max(fo.f) < 5",
                                    "ORDER BY max(fo.f) * max(fo.f) DESC LIMIT 2"])
def test_float_overflow_fails_as_in_postgresql(conn: psycopg.Connection[Any],
                                               spark_backend: SparkBackend,
                                               clause: str) -> None:
    """PostgreSQL fails float8 arithmetic whose finite operands give an infinite result;
    Spark gave Infinity, which HAVING (or ORDER BY) then compared: the capture succeeded
    where the query fails, and the sketch could skip the rows that make it fail. Infinite
    operands stay infinite without an error in both."""
    conn.execute("DROP TABLE IF EXISTS fo")
    conn.execute("CREATE TABLE fo (id serial PRIMARY KEY, g int, f float8)")
    conn.execute("INSERT INTO fo (g, f) SELECT i % 6, i FROM generate_series(1, 300) i")
    conn.execute("UPDATE fo SET f = 'Infinity' WHERE id = 7")
    conn.execute("ANALYZE fo")
    text = f"SELECT fo.g, max(fo.f) FROM fo GROUP BY fo.g {clause}"
    analysis, targets = targets_for(conn, text, 4)
    expected = PG.capture(conn, text, analysis, targets)
    assert fragments_of(spark_backend.capture(conn, text, analysis, targets)) == \
        fragments_of(expected)
    conn.execute("UPDATE fo SET f = 1e200 WHERE id = 8")
    with pytest.raises(CaptureError) as info:
        PG.capture(conn, text, analysis, targets)
    assert isinstance(info.value.__cause__, psycopg.errors.NumericValueOutOfRange)
    with pytest.raises(BackendJobFailed, match="overflow"):
        spark_backend.capture(conn, text, analysis, targets)


@pytest.mark.parametrize(("text", "spark"), [
    ("SELECT ct.g, ct.k, count(*) FROM ct GROUP BY ct.g, ct.k HAVING count(*) > 5", False),
    ("SELECT ct.g, ct.s, sum(ct.v) FROM ct GROUP BY ct.g, ct.s ORDER BY ct.s, ct.g LIMIT 2",
     False),
    ("SELECT ct.g, ct.c, sum(ct.v) FROM ct GROUP BY ct.g, ct.c ORDER BY ct.c, ct.g LIMIT 2",
     True),
])
def test_column_collations_spark_cannot_follow_run_in_postgresql(
        conn: psycopg.Connection[Any], spark_backend: SparkBackend, text: str,
        spark: bool) -> None:
    """Spark groups by exact strings and orders by code points. PostgreSQL groups ``'a'``
    with ``'A'`` under a case-insensitive (nondeterministic) collation, and orders an
    ``"en-x-icu"`` column by that locale even in a C database. (Found: such a group key got
    an empty sketch where PostgreSQL's has every fragment; the top-k ordered by code points
    kept fragments 1 and 2 where PostgreSQL's is fragment 1.) Those jobs are refused (the
    router runs them in PostgreSQL); a column collated "C" still runs on Spark."""
    conn.execute("DROP TABLE IF EXISTS ct")
    conn.execute("DROP COLLATION IF EXISTS ct_nocase")
    conn.execute("CREATE COLLATION ct_nocase (provider = icu, locale = 'und-u-ks-level2',"
                 " deterministic = false)")
    conn.execute('CREATE TABLE ct (id serial PRIMARY KEY, g int, k text COLLATE ct_nocase,'
                 ' s text COLLATE "en-x-icu", c text COLLATE "C", v int)')
    conn.execute("INSERT INTO ct (g, k, s, c, v) SELECT i / 8, CASE WHEN i % 2 = 0 THEN 'a'"
                 " ELSE 'A' END, (ARRAY['a','B','c','D'])[(i / 8) % 4 + 1],"
                 " (ARRAY['a','B','c','D'])[(i / 8) % 4 + 1], i FROM generate_series(0, 399) i")
    conn.execute("ANALYZE ct")
    analysis, targets = targets_for(conn, text, 10)
    expected = PG.capture(conn, text, analysis, targets)
    if spark:
        got = spark_backend.capture(conn, text, analysis, targets)
        assert fragments_of(got) == fragments_of(expected)
    else:
        with pytest.raises(BackendUnsupported, match="collation"):
            spark_backend.capture(conn, text, analysis, targets)
