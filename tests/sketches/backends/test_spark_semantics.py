"""Where Spark SQL's semantics differ from PostgreSQL's, the Spark job refuses or fails (the
router then runs the work in PostgreSQL) or is made to agree — never a different sketch or
state. Each test is a difference found by comparing Spark's captures and states with
PostgreSQL's (real PostgreSQL, real PySpark).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sketches.backends.base import BackendJobFailed, BackendUnsupported, MatchRequest
from sketches.backends.plan import Bin, Lit, Neg, Ref, translate
from sketches.backends.postgres import PostgresBackend
from sketches.backends.routing import RoutedBackend
from sketches.backends.spark import EXCLUDED_RULES, JVM_OPTIONS, SparkBackend, SparkSettings
from sketches.capture import CaptureResult
from sketches.cost import CostSettings
from sketches.errors import CaptureError
from tests.sketches.backends.helpers import fragments_of, targets_for

pytestmark = pytest.mark.slow

PG = PostgresBackend()
ROOT = Path(__file__).resolve().parents[3]


def grouped(conn: psycopg.Connection[Any], table: str, column: str, where: str) -> None:
    """``table (id, g, <column>)``, 200 rows in 20 groups ``g``: ``where`` (SQL over ``i``
    and ``g = i % 20``) gives the column's value, 0 elsewhere."""
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    conn.execute(f"CREATE TABLE {table} (id serial PRIMARY KEY, g int, {column})")
    name = column.split()[0]
    conn.execute(f"INSERT INTO {table} (g, {name}) SELECT i % 20, {where}"
                 " FROM generate_series(0, 199) i")
    conn.execute(f"ANALYZE {table}")


def both(conn: psycopg.Connection[Any], spark: SparkBackend, text: str,
         params: Sequence[object] | None = None,
         fragments: int = 8) -> tuple[CaptureResult, CaptureResult]:
    analysis, targets = targets_for(conn, text, fragments)
    return (PG.capture(conn, text, analysis, targets, params),
            spark.capture(conn, text, analysis, targets, params))


def spark_capture(conn: psycopg.Connection[Any], spark: SparkBackend, text: str,
                  params: Sequence[object] | None = None, fragments: int = 8) -> CaptureResult:
    analysis, targets = targets_for(conn, text, fragments)
    return spark.capture(conn, text, analysis, targets, params)


def pg_fails(conn: psycopg.Connection[Any], text: str,
             params: Sequence[object] | None = None, fragments: int = 8) -> None:
    analysis, targets = targets_for(conn, text, fragments)
    with pytest.raises(CaptureError):
        PG.capture(conn, text, analysis, targets, params)


@contextmanager
def python_time_zone(zone: str) -> Iterator[None]:
    old = os.environ.get("TZ")
    os.environ["TZ"] = zone
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = old
        time.tzset()


# ------------------------------------------------------------------ collations


@pytest.mark.parametrize(("collation", "spark"), [("en-x-icu", False), ("C", True)])
def test_topk_rows_ordered_by_text_follow_the_collation_check(
        conn: psycopg.Connection[Any], spark_backend: SparkBackend, collation: str,
        spark: bool) -> None:
    """A top-k over rows (no grouping) ordered by a column collated "en-x-icu" in a C
    database: the collation check ran on the grouped path only, so Spark ordered the rows
    by code points ('Z' < 'a') and captured fragment 1 where PostgreSQL's is fragment 0.
    Refused now; a column collated "C" still runs on Spark."""
    conn.execute("DROP TABLE IF EXISTS tr")
    conn.execute(f'CREATE TABLE tr (id serial PRIMARY KEY, s text COLLATE "{collation}",'
                 " v int)")
    conn.execute("INSERT INTO tr (s, v) SELECT CASE WHEN i < 5 THEN 'Z' WHEN i % 2 = 0"
                 " THEN 'a' ELSE 'b' END, i FROM generate_series(0, 204) i")
    conn.execute("ANALYZE tr")
    agrees_or_refuses_the_collation(conn, spark_backend,
                                    "SELECT tr.s, tr.v FROM tr ORDER BY tr.s, tr.v LIMIT 3",
                                    spark, fragments=2)


def agrees_or_refuses_the_collation(conn: psycopg.Connection[Any], spark_backend: SparkBackend,
                                    text: str, spark: bool, fragments: int) -> None:
    """Spark's capture of ``text`` is PostgreSQL's (``spark``), or refused for the collation."""
    if spark:
        expected, got = both(conn, spark_backend, text, fragments=fragments)
        assert fragments_of(got) == fragments_of(expected)
    else:
        with pytest.raises(BackendUnsupported, match="collation"):
            spark_capture(conn, spark_backend, text, fragments=fragments)


@pytest.mark.parametrize(("encoding", "spark"), [("WIN1252", False), ("LATIN1", True),
                                                 ("UTF8", True)])
def test_text_order_in_a_c_database_follows_its_encoding(
        admin_dsn: str, spark_backend: SparkBackend, encoding: str, spark: bool) -> None:
    """C compares the database encoding's bytes, Spark code points: the same order in UTF8
    and LATIN1, not in WIN1252, where ``€`` (0x80) sorts below ``é`` (0xE9) and ``Œ`` (0x8C)
    below ``ÿ`` (0xFF). (Found: a WIN1252 database kept the top-k ``Œ…`` in Spark where
    PostgreSQL's is ``ÿ…``.) Refused there; the others still run on Spark."""
    name = f"enc_{encoding.lower()}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name} ENCODING '{encoding}' TEMPLATE template0"
                      " LC_COLLATE 'C' LC_CTYPE 'C'")
    try:
        with psycopg.connect(psycopg.conninfo.make_conninfo(admin_dsn, dbname=name),
                             autocommit=True) as conn:
            conn.execute("CREATE TABLE sw (id serial PRIMARY KEY, k text, v int)")
            letters = "ARRAY['\u00e9','a','\u00ff','b']" if encoding == "LATIN1" \
                else "ARRAY['\u20ac','\u00e9','a','\u0152','\u00ff']"
            conn.execute(f"INSERT INTO sw (k, v) SELECT ({letters})[1 + i % 4] || (i % 7),"
                         " i FROM generate_series(0, 399) i ORDER BY i % 4")
            conn.execute("ANALYZE sw")
            agrees_or_refuses_the_collation(
                conn, spark_backend,
                "SELECT sw.k, count(*) FROM sw GROUP BY sw.k ORDER BY sw.k DESC LIMIT 3",
                spark, fragments=4)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.mark.parametrize(("collation", "spark"), [("en-x-icu", False), ("C", True)])
def test_state_of_text_min_max_follows_the_collation_check(
        conn: psycopg.Connection[Any], spark_backend: SparkBackend, collation: str,
        spark: bool) -> None:
    """A state keeping min / max of a text column collated "en-x-icu": Spark ranked the
    values by code points, so a group kept 'B', 'D' as its smallest where PostgreSQL keeps
    'a', 'B'. Refused now; a column collated "C" still builds on Spark."""
    conn.execute("DROP TABLE IF EXISTS tx")
    conn.execute(f'CREATE TABLE tx (id serial PRIMARY KEY, g int, s text COLLATE "{collation}")')
    conn.execute("INSERT INTO tx (g, s) SELECT i % 5, (ARRAY['a','B','c','D','Z'])"
                 "[(i / 5) % 5 + 1] FROM generate_series(0, 99) i")
    conn.execute("ANALYZE tx")
    text = "SELECT tx.g, min(tx.s), max(tx.s) FROM tx GROUP BY tx.g"
    analysis, targets = targets_for(conn, text, 4)
    if spark:
        assert spark_backend.build_state(conn, analysis, targets, None, 2).same_as(
            PG.build_state(conn, analysis, targets, None, 2))
        return
    with pytest.raises(BackendUnsupported, match="collation"):
        spark_backend.build_state(conn, analysis, targets, None, 2)
    with pytest.raises(BackendUnsupported, match="collation"):
        spark_backend.full_maintenance(conn, text, analysis, targets, None, 2)


def test_match_rows_refuses_a_nondeterministic_collation(
        conn: psycopg.Connection[Any], spark_backend: SparkBackend) -> None:
    """match_rows compared the keys in Spark without the collation check: PostgreSQL matches
    'a' with 'A' under a case-insensitive collation (20 rows), Spark found 10."""
    conn.execute("DROP TABLE IF EXISTS mr")
    conn.execute("DROP COLLATION IF EXISTS mr_nocase")
    conn.execute("CREATE COLLATION mr_nocase (provider = icu, locale = 'und-u-ks-level2',"
                 " deterministic = false)")
    conn.execute("CREATE TABLE mr (id int, k text COLLATE mr_nocase, label int)")
    conn.execute("INSERT INTO mr SELECT i, CASE WHEN i % 2 = 0 THEN 'a' ELSE 'A' END, i"
                 " FROM generate_series(0, 19) i")
    conn.execute("ANALYZE mr")
    _, targets = targets_for(conn, "SELECT mr.id, count(*) FROM mr GROUP BY mr.id", 4)
    request = MatchRequest("public", "mr", ("id", "label"), ("k",), targets[0])
    assert len(PG.match_rows(conn, request, [("a",)])) == 20
    with pytest.raises(BackendUnsupported, match="nondeterministic"):
        spark_backend.match_rows(conn, request, [("a",)])


# ------------------------------------------------------------------ decimals


def test_decimal_product_beyond_38_digits_is_refused(conn: psycopg.Connection[Any],
                                                     spark_backend: SparkBackend) -> None:
    """numeric(20,20) * numeric(20,20) has scale 40: Spark bounds the product to
    decimal(38,38) and 1e-20 * 1e-20 became 0, so ``HAVING max(w) * max(w) > 0`` dropped the
    group PostgreSQL keeps. Refused; a product of scale 37 stays exact on Spark."""
    grouped(conn, "dp", "w numeric(20,20)",
            "CASE WHEN i % 20 = 3 THEN 0.00000000000000000001 ELSE 0 END")
    with pytest.raises(BackendUnsupported, match="decimal product"):
        spark_capture(conn, spark_backend, "SELECT dp.g, max(dp.w) FROM dp GROUP BY dp.g"
                      " HAVING max(dp.w) * max(dp.w) > 0")
    expected, got = both(conn, spark_backend, "SELECT dp.g, max(dp.w) FROM dp GROUP BY dp.g"
                         " HAVING max(dp.w) * 0.00000000000000001 > 0")
    assert fragments_of(got) == fragments_of(expected) and fragments_of(expected)[0]


@pytest.mark.parametrize("text", [
    "SELECT ds.g, max(ds.w) FROM ds GROUP BY ds.g HAVING max(ds.w) > 0",
    "SELECT ds.w, count(*) FROM ds GROUP BY ds.w",
])
def test_numeric_beyond_decimal_38_38_is_refused(conn: psycopg.Connection[Any],
                                                 spark_backend: SparkBackend,
                                                 text: str) -> None:
    """A numeric(50,45) column: Spark reads it as decimal(38,38) and rounds each value, so
    1e-42 was read as 0 (the HAVING group lost from the sketch; group keys 0, 1e-42, 2e-42
    merged in the state). Refused like an unconstrained numeric."""
    grouped(conn, "ds", "w numeric(50,45)", "(i % 3) * 1e-42")
    analysis, targets = targets_for(conn, text, 4)
    with pytest.raises(BackendUnsupported, match="numeric\\(50,45\\)"):
        spark_backend.capture(conn, text, analysis, targets)
    with pytest.raises(BackendUnsupported, match="numeric\\(50,45\\)"):
        spark_backend.build_state(conn, analysis, targets, None, 3)


# ------------------------------------------------------------------ integer types


def test_translation_keeps_postgresql_types() -> None:
    """Unary minus stays a negation in the operand's type (not ``0 - x``, an int4
    subtraction); an integer literal beyond int4 is a bigint when it fits int8 (PostgreSQL's
    ``make_const``), a numeric beyond; a parameter inside arithmetic is refused (typed by
    its bound value in PostgreSQL), one compared with a value is not."""
    names = {"sum(v)": "a0", "min(s)": "a1"}
    none: frozenset[str] = frozenset()
    assert translate("-min(s) < 0", names, none, None) == Bin("<", Neg(Ref("a1")), Lit(0))
    assert translate("sum(v) > 3000000000", names, none, None) == \
        Bin(">", Ref("a0"), Lit(3000000000, "int8"))
    assert translate("sum(v) > -2147483648", names, none, None) == \
        Bin(">", Ref("a0"), Lit(-2147483648, "int8"))
    assert translate("sum(v) > 9223372036854775808", names, none, None) == \
        Bin(">", Ref("a0"), Lit(Decimal("9223372036854775808")))
    assert translate("min(s) < $1", names, none, (1,)) == Bin("<", Ref("a1"), Lit(1))
    for refused in ("min(s) + $1 < 0", "$1 * sum(v) > 0", "-$1 < min(s)"):
        with pytest.raises(BackendUnsupported, match="inside arithmetic"):
            translate(refused, names, none, (1,))


def test_unary_minus_keeps_the_smallint_overflow(conn: psycopg.Connection[Any],
                                                 spark_backend: SparkBackend) -> None:
    """``-x`` was translated as ``0 - x``, an int subtraction in Spark: -(-32768) = 32768
    where PostgreSQL's smallint negation fails, so the capture succeeded (and the sketch
    answered a row) where the query fails. Spark's own negation keeps the type and fails."""
    text = "SELECT sn.g, min(sn.s) FROM sn GROUP BY sn.g HAVING -min(sn.s) < 0"
    grouped(conn, "sn", "s smallint", "CASE WHEN i % 20 = 3 THEN -32767"
            " WHEN i % 20 = 19 THEN 100 ELSE 0 END")
    expected, got = both(conn, spark_backend, text)
    assert fragments_of(got) == fragments_of(expected) and fragments_of(expected)[0]
    conn.execute("UPDATE sn SET s = -32768 WHERE s = -32767")
    pg_fails(conn, text)
    with pytest.raises(BackendJobFailed, match="OVERFLOW|overflow"):
        spark_capture(conn, spark_backend, text)


def test_parameter_inside_arithmetic_is_refused(conn: psycopg.Connection[Any],
                                                spark_backend: SparkBackend) -> None:
    """psycopg binds the Python int 1 as smallint, so ``min(s) + $1`` is smallint arithmetic
    in PostgreSQL (32767 + 1 fails) and int arithmetic in Spark (succeeded): refused. A
    parameter compared with a value still runs on Spark."""
    grouped(conn, "sp2", "s smallint", "CASE WHEN i % 20 = 3 THEN 32767"
            " WHEN i % 20 = 19 THEN -5 ELSE 0 END")
    text = "SELECT sp2.g, min(sp2.s) FROM sp2 GROUP BY sp2.g HAVING min(sp2.s) + $1 < 0"
    pg_fails(conn, text, (1,))
    with pytest.raises(BackendUnsupported, match="inside arithmetic"):
        spark_capture(conn, spark_backend, text, (1,))
    expected, got = both(conn, spark_backend, "SELECT sp2.g, min(sp2.s) FROM sp2"
                         " GROUP BY sp2.g HAVING min(sp2.s) + 1 < $1", (0,))
    assert fragments_of(got) == fragments_of(expected) and fragments_of(expected)[0]


def test_literal_beyond_int4_is_a_bigint(conn: psycopg.Connection[Any],
                                         spark_backend: SparkBackend) -> None:
    """PostgreSQL types 3000000000 bigint (it fits int8): ``sum(v) * 3000000000`` fails
    'bigint out of range' for a sum of 4e9; the literal was a Decimal in Spark, which
    multiplied exactly and answered. A bigint literal overflows in Spark as well now."""
    grouped(conn, "il", "v int", "CASE WHEN i % 20 = 3 THEN 2000000000"
            " WHEN i % 20 = 19 THEN -1 ELSE 0 END")
    text = "SELECT il.g, sum(il.v) FROM il GROUP BY il.g HAVING sum(il.v) * 3000000000 < 0"
    pg_fails(conn, text)
    with pytest.raises(BackendJobFailed, match="OVERFLOW|overflow"):
        spark_capture(conn, spark_backend, text)


# column type, overflowing value, in-range value, HAVING that fails, HAVING in range, and
# the values of $1 in each
OUT_OF_RANGE = [
    ("smallint", 292, 11, "max(uc.s) * max(uc.s) > 80000", "max(uc.s) * max(uc.s) > 100", None),
    ("smallint", 292, 11, "max(uc.s) * max(uc.s) > $1", "max(uc.s) * max(uc.s) > $1",
     (80000, 100)),
    ("int", 999, 11, "max(uc.s) * max(uc.s) * 3000 > 3000000000",
     "max(uc.s) * max(uc.s) * 3000 > 300000", None),
    ("int", 999, 11, "max(uc.s) * max(uc.s) * 3000 = 3000000000",
     "max(uc.s) * max(uc.s) * 3000 = 363000", None),
    ("bigint", 999, 11, "max(uc.s) * 90000000000000000 > 9223372036854775808",
     "max(uc.s) * 90000000000000000 > 900000000000000000", None),
    ("int", 999, 11, "max(uc.s) + 2147483000 + -2147483000 > 0",
     "max(uc.s) + 2147483000 + -2147483000 > 5", None),
    ("int", 999, 11, "count(*) * 9223372036854775807 = count(*) * 9223372036854775807",
     "count(*) * max(uc.s) * 1000 = count(*) * 11000", None),
    ("smallint", 292, 11, "max(uc.s) * max(uc.s) > 0 AND NOT (max(uc.s) * max(uc.s) > 0)",
     "max(uc.s) * max(uc.s) > 100 AND NOT (max(uc.s) * max(uc.s) > 1000)", None),
]


@pytest.mark.parametrize(("column", "big", "small", "failing", "in_range", "bound"),
                         OUT_OF_RANGE)
def test_overflow_compared_with_a_constant_beyond_its_type_fails_as_in_postgresql(
        conn: psycopg.Connection[Any], spark_backend: SparkBackend, column: str, big: int,
        small: int, failing: str, in_range: str, bound: tuple[int, int] | None) -> None:
    """``HAVING max(s) * max(s) > 80000`` over a smallint: PostgreSQL fails 22003 'smallint
    out of range'; Catalyst decided the comparison without the product (a smallint is never
    above 80000), so the Spark capture succeeded with an empty sketch and the query answered
    no rows. Same for int against a bigint constant, bigint against a numeric constant (the
    analyzer), a bound ``$1``, ``x + c1 + c2`` folded to ``x + 0``, ``x = x`` of a
    non-nullable ``x`` and ``x AND NOT x``. Now the Spark job fails, the capture falls back and
    the caller gets PostgreSQL's own error; in range, Spark's capture is PostgreSQL's."""
    grouped(conn, "uc", f"s {column}", f"CASE WHEN i % 20 = 3 THEN {big} ELSE 1 END")
    routed = RoutedBackend(CostSettings(mode="spark"), spark=spark_backend)
    params = None if bound is None else bound[:1]
    text = f"SELECT uc.g, max(uc.s) FROM uc GROUP BY uc.g HAVING {failing}"
    with pytest.raises(psycopg.Error) as direct:
        conn.execute(text.replace("$1", "%s"), params)
    analysis, targets = targets_for(conn, text, 8)
    with pytest.raises(BackendJobFailed, match="OVERFLOW"):
        spark_backend.capture(conn, text, analysis, targets, params)
    with pytest.raises(CaptureError) as routed_error:  # fell back: PostgreSQL's own error
        routed.capture(conn, text, analysis, targets, params)
    assert getattr(routed_error.value.__cause__, "sqlstate", None) == direct.value.sqlstate \
        == "22003"

    conn.execute(f"UPDATE uc SET s = {small} WHERE s = {big}")
    params = None if bound is None else bound[1:]
    text = f"SELECT uc.g, max(uc.s) FROM uc GROUP BY uc.g HAVING {in_range}"
    assert conn.execute(text.replace("$1", "%s"), params).fetchall() == [(3, small)]
    analysis, targets = targets_for(conn, text, 8)
    expected = PG.capture(conn, text, analysis, targets, params)
    got = routed.capture(conn, text, analysis, targets, params)
    decision = routed.last_decision()
    assert decision is not None and decision.ran_on == "spark", decision
    assert fragments_of(got) == fragments_of(expected) and fragments_of(expected)[0]


def test_configured_excluded_rules_keep_the_exclusions() -> None:
    """A configured ``spark.sql.optimizer.excludedRules`` adds to :data:`EXCLUDED_RULES`
    instead of replacing them (each hides an overflow, see the test above)."""
    conf = SparkSettings(conf=(("spark.sql.optimizer.excludedRules", "a.B"),)).spark_conf()
    assert conf["spark.sql.optimizer.excludedRules"].split(",") == ["a.B", *EXCLUDED_RULES]


# ------------------------------------------------------------------ dates and time zones


def test_dates_before_the_gregorian_reform_fail_the_job(conn: psycopg.Connection[Any],
                                                        spark_backend: SparkBackend) -> None:
    """pgjdbc reads dates and timestamps through the JVM's hybrid Julian/Gregorian calendar:
    1582-10-12 came back as 1582-10-22 and ordered after 1582-10-15 (another top-k), and
    state keys / min / max came back shifted. A job reading such a value fails now (the
    work runs in PostgreSQL); the guard fails at run time on such rows only, so a read that
    filters them out still runs on Spark."""
    conn.execute("DROP TABLE IF EXISTS gg")
    conn.execute("CREATE TABLE gg (id serial PRIMARY KEY, g int, d date, at timestamp, v int)")
    conn.execute("INSERT INTO gg (g, d, at, v) SELECT i % 5, CASE WHEN i % 2 = 0 THEN date"
                 " '1582-10-12' ELSE date '1582-10-15' END, timestamp '1582-10-15 00:00' +"
                 " i * interval '1 day', i FROM generate_series(0, 99) i")
    conn.execute("ANALYZE gg")
    top = "SELECT gg.d, gg.v FROM gg {} ORDER BY gg.d DESC, gg.v LIMIT 1"
    with pytest.raises(BackendJobFailed, match="pre-Gregorian"):
        spark_capture(conn, spark_backend, top.format(""), fragments=3)
    expected, got = both(conn, spark_backend, top.format("WHERE gg.d >= '1582-10-15'"),
                         fragments=3)
    assert fragments_of(got) == fragments_of(expected)
    state = "SELECT gg.g, min(gg.at), max(gg.at) FROM gg GROUP BY gg.g"
    analysis, targets = targets_for(conn, state, 4)
    assert spark_backend.build_state(conn, analysis, targets, None, 3).same_as(
        PG.build_state(conn, analysis, targets, None, 3))
    conn.execute("UPDATE gg SET at = timestamp '1582-10-14 23:59:59' WHERE id = 7")
    with pytest.raises(BackendJobFailed, match="pre-Gregorian"):
        spark_backend.build_state(conn, analysis, targets, None, 3)


def test_topk_ties_do_not_depend_on_the_python_time_zone(
        conn: psycopg.Connection[Any], spark_backend: SparkBackend) -> None:
    """The top-k tie filter compared the order key with ``F.lit(<k-th value>)``: a naive
    datetime became a TIMESTAMP in the Python process's local TimeZone, compared with the
    TIMESTAMP_NTZ column in UTC. Under TZ=America/New_York it matched nothing and the
    groups tied with the k-th were missing from Spark's sketch."""
    grouped(conn, "gt", "at timestamp", "CASE WHEN i % 20 IN (2, 9, 15) THEN timestamp"
            " '2021-06-01 12:00:00' ELSE timestamp '2021-01-01' + i * interval '1 minute' END")
    with python_time_zone("America/New_York"):
        expected, got = both(conn, spark_backend, "SELECT gt.g, max(gt.at) FROM gt"
                             " GROUP BY gt.g ORDER BY max(gt.at) DESC LIMIT 1")
    assert fragments_of(got) == fragments_of(expected)
    assert len(fragments_of(expected)[0]) == 3


def test_spark_jvms_run_in_utc() -> None:
    """Configured ``extraJavaOptions`` are kept, with the UTC option added."""
    conf = SparkSettings(conf=(("spark.driver.extraJavaOptions", "-Xss4m"),)).spark_conf()
    assert conf["spark.driver.extraJavaOptions"] == f"-Xss4m {JVM_OPTIONS}"
    assert conf["spark.executor.extraJavaOptions"] == JVM_OPTIONS


_DST_GAP_SCRIPT = r'''
import json, sys
import psycopg
from sketches.backends.spark import SparkBackend, SparkRuntime, SparkSettings
from sketches.backends.postgres import PostgresBackend
from tests.sketches.backends.helpers import fragments_of, targets_for
dsn, text = sys.argv[1], sys.argv[2]
rt = SparkRuntime(SparkSettings(master="local[1]", conf=(("spark.sql.shuffle.partitions", "2"),
                                ("spark.driver.memory", "512m")), max_partitions=2))
rt.start()
assert rt.wait(300), rt.reason
try:
    with psycopg.connect(dsn, autocommit=True) as conn:
        analysis, targets = targets_for(conn, text, 3)
        pg = PostgresBackend().capture(conn, text, analysis, targets)
        sp = SparkBackend(rt).capture(conn, text, analysis, targets)
        print("RESULT " + json.dumps([fragments_of(pg), fragments_of(sp)]))
finally:
    rt.stop()
'''


def test_timestamps_in_a_dst_gap_of_the_host_zone(conn: psycopg.Connection[Any],
                                                  db_dsn: str) -> None:
    """On a host in America/New_York the JVM inherited the zone and pgjdbc's getTimestamp
    read 2021-03-14 02:45 (in the spring-forward gap, a valid PostgreSQL timestamp) as
    03:45, ordered after 03:40. The JVMs run in UTC now (a separate process: the zone is
    the JVM's from its start)."""
    conn.execute("DROP TABLE IF EXISTS jt")
    conn.execute("CREATE TABLE jt (id serial PRIMARY KEY, at timestamp, v int)")
    conn.execute("INSERT INTO jt (at, v) SELECT CASE WHEN i % 2 = 0 THEN timestamp"
                 " '2021-03-14 02:45' ELSE timestamp '2021-03-14 03:40' END, i"
                 " FROM generate_series(0, 99) i")
    conn.execute("ANALYZE jt")
    text = "SELECT jt.at, jt.v FROM jt ORDER BY jt.at DESC, jt.v LIMIT 1"
    proc = subprocess.run([sys.executable, "-c", _DST_GAP_SCRIPT, db_dsn, text], cwd=ROOT,
                          env=dict(os.environ, TZ="America/New_York"), capture_output=True,
                          text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stderr[-3000:]
    expected, got = json.loads(lines[0].removeprefix("RESULT "))
    assert got == expected
