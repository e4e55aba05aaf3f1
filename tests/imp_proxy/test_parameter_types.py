"""Extended-protocol parameters through the proxy with the real sketch library: whatever type
a client declares for ``$n``, the proxied answer is PostgreSQL's, before and after writes.

The library's own statements (capture, delta reads, a restarted manager's) bind a decoded
value with psycopg's type for it, inline it, or leave it to be read as the type PostgreSQL
infers; a declared type that means something else passes through
(``intercept.same_meaning``). Every test here failed on the code before it (found by a
search for parameters the proxy reads otherwise than PostgreSQL)."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg.types.string import StrDumper

import pg_extensions

from .test_sketch_manager import _same_rows_as, ldsn, library_proxy, rounds_until_used, stats

__all__ = ["library_proxy", "ldsn"]   # module fixtures used through their names

Conn = psycopg.Connection[Any]


def _table(d: Conn, name: str, cols: str, fill: str, *updates: str) -> None:
    """``name`` with 5200 rows in 40 groups ``g`` (130 each), tracked before any capture,
    so a later write is maintained, not recaptured."""
    d.execute(f"CREATE TABLE {name} (id serial PRIMARY KEY, g int, {cols})")
    d.execute(f"INSERT INTO {name} SELECT i, i % 40, {fill} FROM generate_series(1, 5200) i")
    d.execute(f"SELECT setval(pg_get_serial_sequence('{name}', 'id'), 5200)")
    for u in updates:
        d.execute(u)
    d.execute(f"ANALYZE {name}")
    pg_extensions.install(d)
    d.execute("SELECT imp.track_table(%s::regclass)", (name,))


def _same_before_and_after(c: Conn, d: Conn, q: str, args: Any, write: str) -> None:
    for _ in range(3):
        _same_rows_as(c, d, q, args)
    d.execute(write)
    for _ in range(3):
        _same_rows_as(c, d, q, args)


def test_a_text_parameter_against_a_char_column(ldsn: str, db_dsn: str) -> None:
    """``c <> $1`` with ``$1`` declared text compares as text (``'ab' <> 'ab '``); the
    capture read the value as the ``bpchar`` PostgreSQL infers, blanks ignored (found:
    group 7 missing, 39 rows instead of 40)."""
    q = ("SELECT g, count(*) FROM pt_bp WHERE c <> %s GROUP BY g HAVING count(*) > 125"
         " ORDER BY g")
    with psycopg.connect(db_dsn, autocommit=True) as d, \
            psycopg.connect(ldsn, autocommit=True) as c:
        for conn in (c, d):
            conn.adapters.register_dumper(str, StrDumper)   # str declared as text
        _table(d, "pt_bp", "c char(3)", "'x'", "UPDATE pt_bp SET c = 'ab' WHERE id IN"
               " (SELECT id FROM pt_bp WHERE g = 7 LIMIT 20)")
        _same_before_and_after(c, d, q, ("ab ",), "INSERT INTO pt_bp (g, c) SELECT 9, 'ab'"
                               " FROM generate_series(1, 3)")
        assert len(d.execute(q, ("ab ",)).fetchall()) == 40


@pytest.mark.parametrize(("column", "fill", "where", "arg", "having"), [
    ("ts timestamp", "CASE WHEN i % 80 < 40 THEN '2020-01-01 03:00'"
     " ELSE '2020-01-01 12:00' END::timestamp", "ts >= %t",
     dt.datetime(2020, 1, 1, 7, 0, tzinfo=dt.timezone(dt.timedelta(hours=5))), 100),
    ("dd date", "CASE WHEN i % 40 = 7 AND i < 1000 THEN '2020-01-01'"
     " ELSE '2020-01-02' END::date", "dd < %t", dt.datetime(2020, 1, 1, 12, 0), 10),
], ids=["timestamptz-timestamp", "timestamp-date"])
def test_a_date_time_parameter_of_another_type_than_its_column(
        ldsn: str, db_dsn: str, column: str, fill: str, where: str, arg: object,
        having: int) -> None:
    """A ``timestamptz`` parameter against a ``timestamp`` column (07:00+05 is 02:00 UTC,
    before every row's 03:00 or 12:00) was read as the timestamp 07:00; a ``timestamp``
    against a ``date`` column as a date (found: no row instead of 40, and instead of 1)."""
    name = column.split()[0]
    table = f"pt_{name}"
    q = (f"SELECT g, count(*) FROM {table} WHERE {where} GROUP BY g"
         f" HAVING count(*) > {having} ORDER BY g")
    with psycopg.connect(db_dsn, autocommit=True) as d, \
            psycopg.connect(ldsn, autocommit=True) as c:
        _table(d, table, column, fill)
        _same_before_and_after(c, d, q, (arg,), f"INSERT INTO {table} (g, {name})"
                               f" SELECT g, {name} FROM {table} WHERE id < 4")
        assert d.execute(q, (arg,)).fetchall()


@pytest.mark.parametrize(("column", "fill", "arg"), [
    ("dd date", "date '2020-01-01' + i % 53", dt.date(2020, 1, 20)),
    ("tz timestamptz", "timestamptz '2020-01-01 00:00+00' + (i % 53) * interval '5 hours'",
     dt.datetime(2020, 1, 5, 11, 0, tzinfo=dt.timezone(dt.timedelta(hours=-3)))),
    ("u uuid", "md5((i % 53)::text)::uuid", uuid.UUID("9f61408e-3afb-633e-50cd-f1b20de6f466")),
], ids=["date", "timestamptz", "uuid"])
def test_binary_date_time_and_uuid_parameters_use_sketches(
        ldsn: str, db_dsn: str, column: str, fill: str, arg: object) -> None:
    """psycopg sends a date, a datetime and a UUID in binary format; the proxy gave the
    library no value for them, so every such query fell back to a plain relay (found by a
    helper's TPC-H search: ``l_shipdate >= %s`` was never sketched while ``IMP EXPLAIN``
    with the literal said ``use``). They are decoded now, sketched, and exact after a
    write."""
    name = column.split()[0]
    table = f"pt_bin_{name}"
    q = (f"SELECT g, count(*) FROM {table} WHERE {name} > %s GROUP BY g"
         f" HAVING count(*) > 60 ORDER BY g")
    with psycopg.connect(db_dsn, autocommit=True) as d, \
            psycopg.connect(ldsn, autocommit=True) as c:
        _table(d, table, column, fill)
        assert d.execute(q, (arg,)).fetchall()
        rounds_until_used(c, lambda: _same_rows_as(c, d, q, (arg,)))
        _same_before_and_after(c, d, q, (arg,), f"UPDATE {table} SET g = 7 WHERE id % 53 = 9")


def test_an_integer_and_a_numeric_divisor(ldsn: str, db_dsn: str) -> None:
    """``v / $1`` divides integers for the integer 2 (which PostgreSQL infers) and as numeric
    for a numeric 2; the numeric query used the integer one's sketch (found: group 7
    missing). Each keeps a sketch of its own."""
    q = ("SELECT g, count(*) FROM pt_div WHERE v / %t > 1 GROUP BY g HAVING count(*) > 115"
         " ORDER BY g")
    with psycopg.connect(db_dsn, autocommit=True) as d, \
            psycopg.connect(ldsn, autocommit=True) as c:
        _table(d, "pt_div", "v int", "9", "UPDATE pt_div SET v = 3 WHERE id IN"
               " (SELECT id FROM pt_div WHERE g = 7 LIMIT 20)")
        rounds_until_used(c, lambda: _same_rows_as(c, d, q, (2,)))
        rounds_until_used(c, lambda: _same_rows_as(c, d, q, (Decimal(2),)))
        _same_before_and_after(c, d, q, (Decimal(2),), "INSERT INTO pt_div (g, v) SELECT 9, 9"
                               " FROM generate_series(1, 3)")
        _same_rows_as(c, d, q, (2,))
        assert len(d.execute(q, (Decimal(2),)).fetchall()) == 40


@pytest.mark.parametrize("literal", [False, True], ids=["parameter", "literal"])
def test_a_session_whose_client_encoding_is_not_utf8(ldsn: str, db_dsn: str,
                                                     literal: bool) -> None:
    """Under ``client_encoding`` LATIN1 the bytes C3 A9 are ``'Ã©'``; the proxy read them
    as UTF-8, ``'é'``, in a parameter and in the SQL text (found: group 7 missing). Such a
    session's queries pass through."""
    table = f"pt_enc_{int(literal)}"
    text = "\u00c3\u00a9"
    q = (f"SELECT g, count(*) FROM {table} WHERE s <> "
         + (f"'{text}'" if literal else "%s") + " GROUP BY g HAVING count(*) > 125 ORDER BY g")
    args = None if literal else (text,)
    with psycopg.connect(db_dsn, autocommit=True) as d, \
            psycopg.connect(ldsn, autocommit=True) as c:
        _table(d, table, "s text", "'x'", f"UPDATE {table} SET s = 'é' WHERE id IN"
               f" (SELECT id FROM {table} WHERE g = 7 LIMIT 20)")
        for conn in (c, d):
            conn.execute("SET client_encoding = 'LATIN1'")
        used = int(stats(c)["proxy.used"])
        _same_before_and_after(c, d, q, args, f"INSERT INTO {table} (g, s) SELECT 9, 'x'"
                               " FROM generate_series(1, 3)")
        assert len(d.execute(q, args).fetchall()) == 40
        assert int(stats(c)["proxy.used"]) == used
        explain = dict(c.execute("IMP EXPLAIN " + q.replace("%s", "'x'")).fetchall())
        assert "client_encoding" in str(explain["reason"]), explain


def test_a_float_threshold_then_a_numeric_one(ldsn: str, db_dsn: str) -> None:
    """``sum(n) > $1`` compares as float8 for a float and exactly for a numeric: the sketch
    of the float ``1.0`` answered the numeric ``1`` (found: no row instead of the group
    summing to 1.00000000000000000001)."""
    q = "SELECT g, sum(n) FROM pt_thr GROUP BY g HAVING sum(n) > %t ORDER BY g"
    with psycopg.connect(db_dsn, autocommit=True) as d, \
            psycopg.connect(ldsn, autocommit=True) as c:
        _table(d, "pt_thr", "n numeric", "CASE WHEN i <= 40 THEN 1 ELSE 0 END",
               "UPDATE pt_thr SET n = 1.00000000000000000001 WHERE g = 7 AND n = 1")
        rounds_until_used(c, lambda: _same_rows_as(c, d, q, (1.0,)))
        _same_before_and_after(c, d, q, (Decimal(1),), "INSERT INTO pt_thr (g, n) SELECT 9, 0"
                               " FROM generate_series(1, 3)")
        _same_rows_as(c, d, q, (1.0,))
        assert len(d.execute(q, (Decimal(1),)).fetchall()) == 1


def test_text_thresholds_are_not_numbers(ldsn: str, db_dsn: str) -> None:
    """``max(s) > $1`` with the text ``'10'`` used the sketch of ``'5'`` as a stricter
    threshold; as text ``'2' > '10'`` (found: group 7 missing)."""
    q = "SELECT g, count(*) FROM pt_txt GROUP BY g HAVING max(s) > %s ORDER BY g"
    with psycopg.connect(db_dsn, autocommit=True) as d, \
            psycopg.connect(ldsn, autocommit=True) as c:
        _table(d, "pt_txt", "s text", "'0'",
               "UPDATE pt_txt SET s = '2' WHERE id = (SELECT min(id) FROM pt_txt WHERE g = 7)",
               "UPDATE pt_txt SET s = '7' WHERE id = (SELECT min(id) FROM pt_txt WHERE g = 9)")
        rounds_until_used(c, lambda: _same_rows_as(c, d, q, ("5",)))
        _same_before_and_after(c, d, q, ("10",), "INSERT INTO pt_txt (g, s) SELECT 11, '0'"
                               " FROM generate_series(1, 3)")
        assert [r[0] for r in d.execute(q, ("10",)).fetchall()] == [7, 9]


def test_integer_parameters_where_numbers_are_inferred_keep_their_sketches(
        ldsn: str, db_dsn: str) -> None:
    """psycopg declares an int as int2/int4/int8 by its value; where PostgreSQL infers
    bigint, numeric or float8 for ``$n`` it means the same, so the query still uses
    sketches (and stays exact after a write)."""
    with psycopg.connect(db_dsn, autocommit=True) as d, \
            psycopg.connect(ldsn, autocommit=True) as c:
        _table(d, "pt_int", "v int, n numeric, f float8", "i % 97, i % 89, i % 83")
        for agg in ("sum(v)", "sum(n)", "sum(f)", "max(f)"):
            q = f"SELECT g, {agg} FROM pt_int GROUP BY g HAVING {agg} > %s ORDER BY g"
            threshold = int(d.execute(f"SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY s)"
                                      f" FROM (SELECT {agg} AS s FROM pt_int GROUP BY g) x"
                                      ).fetchone()[0])
            rounds_until_used(c, lambda q=q, t=threshold: _same_rows_as(c, d, q, (t,)))
            _same_before_and_after(c, d, q, (threshold,), "UPDATE pt_int SET v = v + 50,"
                                   " n = n + 50, f = f + 50 WHERE id % 40 = 3 AND id < 400")
