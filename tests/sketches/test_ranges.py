"""Range partitions: SQL width_bucket and Python bisect agree on every value and type."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from sketches.errors import PartitionError
from sketches.ranges import MAX_BOUND_BYTES, RangePartition, UnorderedType, build_partition, thin

FAST = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

TYPES: dict[str, tuple[str, st.SearchStrategy[Any]]] = {
    "int": ("integer", st.integers(-1000, 1000)),
    "big": ("bigint", st.integers(-(2**40), 2**40)),
    "num": ("numeric(10,3)", st.decimals(min_value=-10000, max_value=10000, places=3,
                                        allow_nan=False, allow_infinity=False)),
    "txt": ("text", st.text(alphabet="aAbBz09 éü_-", max_size=5)),
    "vc": ("character varying(8)", st.text(alphabet="abcXYZé", max_size=8)),
    "dt": ("date", st.dates(min_value=date(1990, 1, 1), max_value=date(2030, 1, 1))),
    "tsp": ("timestamp", st.datetimes(min_value=datetime(2000, 1, 1),
                                      max_value=datetime(2030, 1, 1))),
    "tz": ("timestamptz", st.datetimes(min_value=datetime(2000, 1, 1),
                                       max_value=datetime(2030, 1, 1),
                                       timezones=st.just(UTC))),
}


SAMPLERS: dict[str, Any] = {
    "int": lambda r: r.randint(-1000, 1000),
    "big": lambda r: r.randint(-(2**40), 2**40),
    "num": lambda r: Decimal(r.randint(-10**7, 10**7)) / 1000,
    "txt": lambda r: "".join(r.choice("aAbBz09 éü_-") for _ in range(r.randint(0, 5))),
    "vc": lambda r: "".join(r.choice("abcXYZé") for _ in range(r.randint(0, 8))),
    "dt": lambda r: date(1990, 1, 1) + timedelta(days=r.randint(0, 14000)),
    "tsp": lambda r: datetime(2000, 1, 1) + timedelta(seconds=r.randint(0, 9 * 10**8)),
    "tz": lambda r: datetime(2000, 1, 1, tzinfo=UTC)
    + timedelta(seconds=r.randint(0, 9 * 10**8)),
}


def sql_fragment(conn: psycopg.Connection[Any], p: RangePartition, value: Any) -> int:
    expr = sql.SQL("%s::{}").format(sql.SQL(p.type_name))
    row = conn.execute(sql.SQL("SELECT {}").format(p.fragment_sql(expr)), (value,)).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture(scope="module")
def typed_tables(db_dsn: str) -> dict[str, list[Any]]:
    """One table per type with skewed, duplicated, negative and NULL values."""
    import random
    r = random.Random(42)
    values: dict[str, list[Any]] = {}
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for name, (type_name, _) in TYPES.items():
            sample = [SAMPLERS[name](r) for _ in range(60)]
            rows = [r.choice(sample) if r.random() < 0.8 else sample[0] for _ in range(2000)]
            rows += [None] * 50
            conn.execute(sql.SQL("CREATE TABLE {} (a {})").format(sql.Identifier(name),
                                                                  sql.SQL(type_name)))
            with conn.cursor() as cur, cur.copy(
                    sql.SQL("COPY {} (a) FROM STDIN").format(sql.Identifier(name))) as cp:
                for v in rows:
                    cp.write_row((v,))
            values[name] = rows
    return values


@pytest.mark.parametrize("name", sorted(TYPES))
def test_sql_and_python_agree_on_table_rows(conn: psycopg.Connection[Any],
                                            typed_tables: dict[str, list[Any]],
                                            name: str) -> None:
    p = build_partition(conn, "public", name, "a", fragments=16)
    assert 1 <= p.n <= 15
    assert list(p.bounds) == sorted(set(p.bounds))
    rows = conn.execute(sql.SQL("SELECT a, {} FROM {}").format(
        p.fragment_sql(sql.Identifier("a")), sql.Identifier(name))).fetchall()
    assert rows
    for value, fragment in rows:
        assert p.fragment_of(value) == fragment, (value, fragment)
    # every bound is the first value of its fragment; NULL has its own fragment
    for i, b in enumerate(p.bounds):
        assert p.fragment_of(b) == i + 1 == sql_fragment(conn, p, b)
    assert p.fragment_of(None) == p.n + 1 == sql_fragment(conn, p, None)


@pytest.mark.parametrize("name", sorted(TYPES))
def test_sql_and_python_agree_on_arbitrary_values(conn: psycopg.Connection[Any],
                                                  typed_tables: dict[str, list[Any]],
                                                  name: str) -> None:
    p = build_partition(conn, "public", name, "a", fragments=9)
    type_name, strategy = TYPES[name]

    @FAST
    @given(value=strategy)
    def agree(value: Any) -> None:
        assert p.fragment_of(value) == sql_fragment(conn, p, value)

    agree()


def test_boundaries_negative_and_out_of_histogram(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE neg AS SELECT i AS a FROM generate_series(-500, 499) AS i")
    p = build_partition(conn, "public", "neg", "a", fragments=10)
    assert p.n == 9
    probes = [-10**6, -501, -500, -499, 499, 500, 10**6]
    for b in p.bounds:
        probes += [b - 1, b, b + 1]
    for v in probes:
        assert p.fragment_of(v) == sql_fragment(conn, p, v), v
    assert p.fragment_of(-10**6) == 0
    assert p.fragment_of(10**6) == p.n


def test_statistics_target_raised_for_many_fragments(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE many AS SELECT (i * 7919) % 20011 AS a"
                 " FROM generate_series(1, 20000) AS i")
    p = build_partition(conn, "public", "many", "a", fragments=400)
    target = conn.execute("SELECT attstattarget FROM pg_attribute"
                          " WHERE attrelid = 'many'::regclass AND attname = 'a'").fetchone()
    assert target is not None and target[0] >= 400
    assert 300 < p.n <= 399  # more than the default target's 101 histogram bounds


def test_heavy_duplicates_give_distinct_bounds(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE skew AS SELECT CASE WHEN i % 10 < 8 THEN 5 ELSE i END AS a"
                 " FROM generate_series(1, 5000) AS i")
    p = build_partition(conn, "public", "skew", "a", fragments=50)
    assert list(p.bounds) == sorted(set(p.bounds))
    assert 5 in p.bounds  # the most common value starts a fragment of its own


@pytest.mark.parametrize("ddl", [
    "CREATE TABLE empty_t (a int)",
    "CREATE TABLE nulls_t AS SELECT NULL::int AS a FROM generate_series(1, 100)",
])
def test_empty_and_all_null_columns(conn: psycopg.Connection[Any], ddl: str) -> None:
    conn.execute(ddl)
    table = ddl.split()[2]
    p = build_partition(conn, "public", table, "a", fragments=10)
    assert p.n == 0
    assert p.fragment_of(5) == 0 == sql_fragment(conn, p, 5)
    assert p.fragment_of(None) == 1 == sql_fragment(conn, p, None)


def test_tiny_table_uses_exact_quantiles(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE tiny AS SELECT unnest(ARRAY[3, 1, 2]) AS a")
    p = build_partition(conn, "public", "tiny", "a", fragments=4)
    assert set(p.bounds) <= {1, 2, 3} and p.n >= 1


def test_text_order_is_code_point_order_in_c_locale(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE words (a text)")
    conn.execute("INSERT INTO words SELECT unnest(ARRAY['a', 'B', 'é', 'z', 'Z', 'ü', '', 'aa'])"
                 " FROM generate_series(1, 20)")
    p = build_partition(conn, "public", "words", "a", fragments=8)
    for v in ["", "A", "a", "aa", "ab", "b", "y", "z", "é", "ü", "zz", "\u00e0", "\u4e2d"]:
        assert p.fragment_of(v) == sql_fragment(conn, p, v), v


def test_unknown_column_raises(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE known (a int)")
    with pytest.raises(PartitionError):
        build_partition(conn, "public", "known", "nope")


def test_runs_merge_adjacent_fragments() -> None:
    p = RangePartition("s", "t", "a", "integer", (10, 20, 30, 40), ("10", "20", "30", "40"),
                       "{10,20,30,40}")
    assert p.runs([0, 1, 3, 4, 5]) == [(0, 1), (3, 4)]
    assert p.run_bounds(0, 1) == (None, "20")
    assert p.run_bounds(3, 4) == ("30", None)
    assert p.run_bounds(2, 2) == ("20", "30")
    assert p.covers_all([0, 1, 2, 3, 4, 5])
    assert not p.covers_all([0, 1, 2, 3, 4])
    assert p.covers_all([0, 1, 2, 3, 4], nullable=False)


def test_thin_keeps_sorted_distinct_and_caps_count() -> None:
    values = list(range(1000))
    out = thin(values, 10)
    assert len(out) == 10 and out == sorted(set(out)) and out[0] == 0
    assert thin(values[:5], 10) == values[:5]
    assert thin(values, 0) == []


def test_python_bounds_roundtrip_decimal_and_timestamps(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE rt (n numeric(6,2), ts timestamp)")
    base = datetime(2020, 1, 1)
    with conn.cursor() as cur, cur.copy("COPY rt (n, ts) FROM STDIN") as cp:
        for i in range(500):
            cp.write_row((Decimal(i) / 4 - 50, base + timedelta(minutes=37 * i)))
    for col in ("n", "ts"):
        p = build_partition(conn, "public", "rt", col, fragments=20)
        rows = conn.execute(sql.SQL("SELECT {c}, {f} FROM rt").format(
            c=sql.Identifier(col), f=p.fragment_sql(sql.Identifier(col)))).fetchall()
        assert all(p.fragment_of(v) == f for v, f in rows)


@pytest.mark.parametrize("style", ["SQL, DMY", "German", "Postgres, MDY"])
def test_bounds_text_reads_the_same_in_every_session(conn: psycopg.Connection[Any],
                                                     style: str) -> None:
    """Bounds built under another DateStyle were kept as its text (``01/06/2020``), which a
    session under ``SQL, MDY`` reads as 6 January: now their text is ISO, the session's
    DateStyle is left as it was, and the fragments PostgreSQL computes under another style
    are Python's."""
    table = "ds_" + "".join(ch for ch in style if ch.isalpha()).lower()
    conn.execute(sql.SQL("CREATE TABLE {} (d date, ts timestamp)").format(sql.Identifier(table)))
    conn.execute(sql.SQL("INSERT INTO {} SELECT date '2020-01-01' + i, timestamp '2020-01-01'"
                         " + i * interval '7 hours' FROM generate_series(0, 400) i").format(
        sql.Identifier(table)))
    conn.execute(f"SET DateStyle = '{style}'")
    before = conn.execute("SHOW DateStyle").fetchone()
    parts = [build_partition(conn, "public", table, c, fragments=12) for c in ("d", "ts")]
    assert conn.execute("SHOW DateStyle").fetchone() == before
    conn.execute("SET DateStyle = 'SQL, MDY'")
    for p, col in zip(parts, ("d", "ts"), strict=True):
        rows = conn.execute(sql.SQL("SELECT {c}, {f} FROM {t}").format(
            c=sql.Identifier(col), f=p.fragment_sql(sql.Identifier(col)),
            t=sql.Identifier(table))).fetchall()
        assert all(p.fragment_of(v) == f for v, f in rows), col


def test_nondeterministic_collation_is_refused(conn: psycopg.Connection[Any]) -> None:
    """Equal values under such a collation ('a' = 'A') may lie in different fragments."""
    conn.execute("CREATE COLLATION IF NOT EXISTS ci_test"
                 " (provider = icu, locale = 'und-u-ks-level2', deterministic = false)")
    conn.execute("CREATE TABLE ci_t (a text COLLATE ci_test)")
    conn.execute("INSERT INTO ci_t VALUES ('a'), ('A'), ('b')")
    with pytest.raises(PartitionError, match="nondeterministic"):
        build_partition(conn, "public", "ci_t", "a", fragments=4)


@pytest.mark.parametrize(("table", "column", "extremes"), [
    ("inf_ts", "timestamptz", "'infinity', '-infinity'"),
    ("inf_d", "date", "'infinity', '-infinity'"),
    ("nan_n", "numeric", "'NaN', 'Infinity', '-Infinity'"),
    ("nan_f", "float8", "'NaN', 'Infinity', '-Infinity'"),
    ("far_d", "date", "'0044-03-15 BC', '12000-01-01'"),
    ("far_ts", "timestamp", "'0100-01-01 00:00:00 BC', '15000-01-01 00:00:00'"),
    ("end_t", "time", "'24:00:00'"),
])
def test_infinite_and_nan_values_are_never_bounds(conn: psycopg.Connection[Any], table: str,
                                                  column: str, extremes: str) -> None:
    """±infinity (psycopg cannot load a timestamp or date of it) and NaN (Python cannot order
    it) are left out of the bounds, and so are BC dates, years after 9999 and the time
    24:00:00 (psycopg loads none of them); PostgreSQL orders them first or last, so the first
    or last fragment holds them, in SQL as in the partition (found: every capture on such a
    column failed, and ran ANALYZE again each time). Also through exact quantiles (a tiny
    table)."""
    base = {"timestamptz": "timestamptz '2020-01-01'", "timestamp": "timestamp '2020-01-01'",
            "date": "date '2020-01-01'", "time": "time '00:00'"}.get(column, "0")
    step = {"date": "i", "time": "i * interval '1 second'"}.get(
        column, "i * interval '1 hour'" if column.startswith("timestamp") else "i")
    for name, rows in ((table, 5000), (f"{table}_tiny", 3)):
        conn.execute(sql.SQL(
            "CREATE TABLE {} AS SELECT ({} + {})::{} AS a FROM generate_series(1, {}) AS i"
            " UNION ALL SELECT unnest(ARRAY[{}]::{}[])").format(
                sql.Identifier(name), sql.SQL(base), sql.SQL(step), sql.SQL(column),
                sql.Literal(rows), sql.SQL(extremes), sql.SQL(column)))
        p = build_partition(conn, "public", name, "a", fragments=8)
        assert p.n >= 1 and list(p.bounds) == sorted(set(p.bounds)), p.bounds
        counts = conn.execute(sql.SQL(
            "SELECT count(*) FILTER (WHERE a::text IN ({e}) AND {f} NOT IN (0, {n})),"
            " count(*) FILTER (WHERE {f} IS NULL) FROM {t}").format(
                e=sql.SQL(extremes), f=p.fragment_sql(sql.Identifier("a")),
                n=sql.Literal(p.n), t=sql.Identifier(name))).fetchone()
        assert counts == (0, 0), (name, counts)


def test_types_psycopg_cannot_load_are_refused_before_analyze(
        conn: psycopg.Connection[Any]) -> None:
    """An enum (psycopg loads an array of it as one string, which the bounds were then read
    from character by character) is refused before ANALYZE, which every capture ran again;
    a domain over a built-in type is partitioned through its base type (also cast to it:
    ``ranges.CAST_TYPE``)."""
    conn.execute("CREATE TYPE feel AS ENUM ('sad', 'ok', 'happy')")
    conn.execute("CREATE DOMAIN small AS int CHECK (VALUE < 1000)")
    conn.execute("CREATE TABLE feelings AS SELECT (ARRAY['sad', 'ok', 'happy']::feel[])"
                 "[i % 3 + 1] AS f, (i % 900)::small AS s FROM generate_series(1, 3000) AS i")
    with pytest.raises(PartitionError, match="psycopg cannot load"):
        build_partition(conn, "public", "feelings", "f", fragments=4)
    conn.execute("SELECT pg_stat_force_next_flush()")   # this backend would have analyzed
    analyzed = conn.execute("SELECT analyze_count FROM pg_stat_user_tables"
                            " WHERE relname = 'feelings'").fetchone()
    assert analyzed == (0,)
    p = build_partition(conn, "public", "feelings", "s", fragments=8)
    assert p.type_name == "integer" and p.n >= 1 and all(isinstance(b, int) for b in p.bounds)
    rows = conn.execute(sql.SQL("SELECT s, {} FROM feelings").format(
        p.fragment_sql(sql.Identifier("s")))).fetchall()
    assert all(p.fragment_of(v) == f for v, f in rows)


@pytest.mark.parametrize(("table", "column", "values"), [
    ("un_jsonb", "jsonb", "to_jsonb(i % 40)"),
    ("un_intarr", "int[]", "ARRAY[i % 40]"),
    ("un_tsvector", "tsvector", "to_tsvector('simple', 'w' || (i % 40))"),
    ("un_money", "money", "(i % 40)::numeric::money"),
])
def test_types_python_does_not_order_as_postgresql_are_refused(
        conn: psycopg.Connection[Any], table: str, column: str, values: str) -> None:
    """jsonb bounds came back from pg_stats as Python ints and were sent back as a
    ``smallint[]`` (``cannot cast type smallint[] to jsonb[]``), an ``int[]`` column's
    histogram was read as ``integer[][]`` elements (``invalid input syntax for type integer:
    "{0}"``): each aborted the caller's transaction mid-capture. tsvector and money load as
    text, whose order is not theirs. Refused before any statement: the transaction stays
    usable."""
    conn.execute(sql.SQL("CREATE TABLE {} AS SELECT {}::{} AS a FROM generate_series(1, 2000)"
                         " AS i").format(sql.Identifier(table), sql.SQL(values),
                                         sql.SQL(column)))
    with conn.transaction():
        with pytest.raises(UnorderedType, match="do not sort"):
            build_partition(conn, "public", table, "a", fragments=8)
        count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
        assert count.fetchone() == (2000,)


def test_a_domain_over_an_unordered_type_is_refused(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE DOMAIN doc AS jsonb")
    conn.execute("CREATE TABLE docs AS SELECT to_jsonb(i % 9)::doc AS a"
                 " FROM generate_series(1, 500) AS i")
    with pytest.raises(UnorderedType):
        build_partition(conn, "public", "docs", "a", fragments=4)


def test_blank_padded_bounds_keep_every_character(conn: psycopg.Connection[Any]) -> None:
    """The bounds of a ``character(n)`` column were read and cast back as ``character[]``,
    i.e. ``character(1)[]``: every bound cut to its first character (``'12'`` became
    ``'1'``), so at most one fragment per first character."""
    conn.execute("CREATE TABLE padded AS SELECT lpad((i % 300)::text, 3, '0')::char(3) AS a"
                 " FROM generate_series(1, 3000) AS i")
    p = build_partition(conn, "public", "padded", "a", fragments=16)
    assert p.n >= 10 and all(len(b) == 3 for b in p.bounds), p.bounds
    rows = conn.execute(sql.SQL("SELECT a, {} FROM padded").format(
        p.fragment_sql(sql.Identifier("a")))).fetchall()
    assert all(p.fragment_of(v) == f for v, f in rows)


def test_bounds_are_never_wider_than_analyzes_own_limit(conn: psycopg.Connection[Any]) -> None:
    """Values over 1 kB are not in a column's statistics, and the exact quantiles taken
    instead were whole 100 kB values (found: a 30 MB bounds list, 9 MB instrumented
    queries, 11 s and about 1 GB for a first query). Bounds are at most
    ``MAX_BOUND_BYTES`` wide; a column of wide values only has none (one fragment: no
    sketch on it can skip anything)."""
    conn.execute("CREATE TABLE wide AS SELECT i AS id, CASE WHEN i % 3 = 0"
                 " THEN 'k' || lpad((i % 40)::text, 2, '0')"
                 " ELSE repeat(md5((i % 200)::text), 64) END AS k,"
                 " repeat(md5((i % 90)::text), 64) AS only_wide"
                 " FROM generate_series(1, 3000) AS i")
    p = build_partition(conn, "public", "wide", "k", fragments=16)
    assert p.n >= 2 and all(len(b.encode()) <= MAX_BOUND_BYTES for b in p.bounds), p.bounds
    rows = conn.execute(sql.SQL("SELECT k, {} FROM wide").format(
        p.fragment_sql(sql.Identifier("k")))).fetchall()
    assert all(p.fragment_of(v) == f for v, f in rows)
    assert build_partition(conn, "public", "wide", "only_wide", fragments=16).n == 0
