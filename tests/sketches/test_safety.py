"""Safety rules (DESIGN §4 and the extensions proved in sketches/safety.py)."""

from __future__ import annotations

import random
from typing import Any

import psycopg
import pytest

from sketches.capture import CaptureTarget, capture
from sketches.instrument import instrument
from sketches.ranges import build_partition
from sketches.safety import check, equivalence_classes, errors_kept, exact_equalities
from sketches.sql import ColumnRef, analyse
from sketches.sql.raising import Catalog, numeric_digits

COLUMNS = {"t": ["id", "g", "v", "s"], "dim": ["id", "k", "w"], "u": ["a", "b"]}


def safe_columns(sql: str) -> list[str]:
    a = analyse(sql, lambda s, t: COLUMNS.get(t))
    return [a.qualified(s.column) for s in check(a).safe]


def test_group_by_columns_are_safe_expressions_are_not() -> None:
    assert safe_columns("SELECT g, s, count(*) FROM t GROUP BY g, s HAVING count(*) > 1") == \
        ["t.g", "t.s"]
    assert safe_columns("SELECT g / 10, count(*) FROM t GROUP BY g / 10") == []


def test_join_equivalent_columns_are_safe_transitively() -> None:
    cols = safe_columns("SELECT t.g, count(*) FROM t, dim, u WHERE t.g = dim.k AND dim.k = u.a"
                        " GROUP BY t.g HAVING count(*) > 2")
    assert cols == ["t.g", "dim.k", "u.a"]


def test_equivalence_classes_union_find() -> None:
    a = analyse("SELECT t.g FROM t, dim, u WHERE t.g = dim.k AND u.b = dim.k AND t.v = u.a"
                " GROUP BY t.g", lambda s, t: COLUMNS.get(t))
    classes = equivalence_classes(a)
    assert classes[ColumnRef(0, "g")] == {ColumnRef(0, "g"), ColumnRef(1, "k"),
                                          ColumnRef(2, "b")}
    assert classes[ColumnRef(0, "v")] == {ColumnRef(0, "v"), ColumnRef(2, "a")}


def test_aggregate_arguments_and_where_columns_are_not_safe() -> None:
    assert "t.v" not in safe_columns("SELECT g, sum(v) FROM t WHERE v > 1 GROUP BY g")


@pytest.mark.parametrize(("sql", "reason"), [
    ("SELECT count(*) FROM t", "scalar aggregate"),
    ("SELECT sum(v) FROM t HAVING sum(v) > 3", "scalar aggregate"),
    ("SELECT g FROM t WHERE v > 3", "nothing beyond WHERE"),
    ("SELECT g FROM t LIMIT 3", "LIMIT without ORDER BY"),
    ("SELECT g FROM t ORDER BY g + 1 LIMIT 3", "not a column"),
    ("SELECT DISTINCT * FROM t", "DISTINCT over *"),
    ("SELECT DISTINCT count(*) FROM t GROUP BY g ORDER BY 1 LIMIT 2",
     "DISTINCT over groups with LIMIT"),
])
def test_not_sketchable(sql: str, reason: str) -> None:
    a = analyse(sql, lambda s, t: COLUMNS.get(t))
    verdict = check(a)
    assert not verdict.sketchable and reason in verdict.reason


def test_topk_over_rows_uses_first_order_key_and_its_equivalents() -> None:
    assert safe_columns("SELECT * FROM t ORDER BY v DESC, id LIMIT 5") == ["t.v"]
    assert safe_columns("SELECT t.id FROM t JOIN dim ON t.v = dim.w ORDER BY t.v LIMIT 5") == \
        ["t.v", "dim.w"]


def test_distinct_select_columns_are_safe() -> None:
    assert safe_columns("SELECT DISTINCT g, v + 1 FROM t") == ["t.g"]


def test_ties_at_kth_position_keep_all_candidates(conn: psycopg.Connection[Any]) -> None:
    """Extension 3: many rows tie at the k-th ORDER BY value; the sketch must hold all of
    them, so the instrumented query chooses among the same rows as the original."""
    conn.execute("CREATE TABLE tie (id int, o int)")
    r = random.Random(3)
    rows = [(i, 1 if i < 5 else (50 if i < 400 else r.randint(51, 10000))) for i in range(2000)]
    r.shuffle(rows)
    with conn.cursor() as cur, cur.copy("COPY tie (id, o) FROM STDIN") as cp:
        for row in rows:
            cp.write_row(row)
    sql = "SELECT o FROM tie ORDER BY o LIMIT 10"
    a = analyse(sql)
    p = build_partition(conn, "public", "tie", "o", fragments=50)
    res = capture(conn, sql, a, [CaptureTarget(a.tables[0], "public", "o", p)])
    assert res.parts[0].fragments == {p.fragment_of(1), p.fragment_of(50)}
    text = instrument(sql, res.parts)
    assert text is not None
    tied = conn.execute("SELECT count(*) FROM tie WHERE o = 50").fetchone()
    unlimited = instrument("SELECT o FROM tie", res.parts)
    assert unlimited is not None
    instrumented_candidates = conn.execute(
        f"SELECT count(*) FROM ({unlimited}) AS x WHERE o = 50").fetchone()
    assert tied == instrumented_candidates
    assert conn.execute(sql).fetchall() == conn.execute(text).fetchall()


@pytest.mark.parametrize(("types", "exact"), [
    ((23, 23), True), ((23, 20, 21), True), ((25, 1043), True), ((1700, 1700), True),
    ((701, 1700), False), ((1042, 1043), False), ((23, 701), False), ((20, 1700), False),
    ((1082, 1114), False), ((23, None), False),
])
def test_exact_equalities(types: tuple[int | None, ...], exact: bool) -> None:
    """Only equalities that compare the columns' own values (no cast that can merge values)
    let a join-equivalent column carry a sketch."""
    assert exact_equalities(types) is exact


TYPES = {"id": 23, "g": 23, "v": 23, "s": 25, "n": 20, "w": 1700, "f": 701, "ts": 1114,
         "d": 1082, "c": 16500, "p": 1700, "q": 1700}
"""Column types of table ``e`` (oids): integers, text, numeric, float8, timestamp, date, a
user-created type (a domain over text, citext), and ``p numeric(15, 2)``, ``q numeric(4, 2)``
(:data:`DIGITS`)."""
DIGITS = {"p": (13, 2), "q": (2, 2)}


def errors_verdict(sql: str) -> str | None:
    """The reason rule 5 refuses ``sql`` over ``e`` (None: still sketchable)."""
    a = analyse(sql, lambda s, t: list(TYPES) if t == "e" else None)
    verdict = check(a)
    assert verdict.sketchable, verdict.reason
    catalog = Catalog({ColumnRef(0, c): o for c, o in TYPES.items()},
                      {"ext.citext": "S", "public.stamp": "D", "integer[]": "A"},
                      {ColumnRef(0, c): d for c, d in DIGITS.items()})
    kept = errors_kept(a, verdict, catalog)
    return None if kept.sketchable else kept.reason


@pytest.mark.parametrize("sql", [
    "SELECT id, 10 / (v - 5) AS x FROM e ORDER BY id LIMIT 3",
    "SELECT id, s::int FROM e ORDER BY g DESC, id LIMIT 3",
    "SELECT id, v + 1 FROM e ORDER BY id LIMIT 3",
    "SELECT id, n::int FROM e ORDER BY id LIMIT 3",
    "SELECT id, f::numeric FROM e ORDER BY id LIMIT 3",
    "SELECT id, w::numeric(5, 2) FROM e ORDER BY id LIMIT 3",
    "SELECT id, w > f FROM e ORDER BY id LIMIT 3",
    "SELECT id, CASE WHEN g > 1 THEN w ELSE f END FROM e ORDER BY id LIMIT 3",
    "SELECT id, lower(s) FROM e ORDER BY id LIMIT 3",
    "SELECT id, s LIKE 'a%' FROM e ORDER BY id LIMIT 3",
    "SELECT id, v = $1 FROM e ORDER BY id LIMIT 3",
    "SELECT g, sum(v), max(10 / (v - 5)) FROM e GROUP BY g HAVING sum(v) > 3050",
    "SELECT g, sum(f) FROM e GROUP BY g HAVING count(*) > 3",
    "SELECT g, avg(f) FROM e GROUP BY g HAVING count(*) > 3",
    "SELECT g, sum(v + 1) FROM e GROUP BY g HAVING count(*) > 3",
    "SELECT g, sum(v), count(s::int) FROM e GROUP BY g ORDER BY sum(v) DESC LIMIT 2",
    "SELECT g, sum(v) AS s, 10 / (g + 5) AS z FROM e GROUP BY g ORDER BY s DESC LIMIT 2",
    "SELECT g, sum(v) / count(*) AS m FROM e GROUP BY g ORDER BY sum(v) DESC LIMIT 2",
    "SELECT g, sum(w * (1 - q)) FROM e GROUP BY g HAVING count(*) > 3",
    "SELECT g, sum(v * 2) FROM e GROUP BY g HAVING count(*) > 3",
    "SELECT g, sum(p * f) FROM e GROUP BY g HAVING count(*) > 3",
    "SELECT g, sum(p / q) FROM e GROUP BY g HAVING count(*) > 3",
    "SELECT g, sum(p * $1) FROM e GROUP BY g HAVING count(*) > 3",
    "SELECT g, sum(p * 1e20000) FROM e GROUP BY g HAVING count(*) > 3",
    "SELECT id, -v FROM e ORDER BY id LIMIT 3",
    "SELECT id, p * q > f FROM e ORDER BY id LIMIT 3",
    "SELECT g, sum(v * 10000000000) FROM e GROUP BY g HAVING count(*) > 3",
    "SELECT id, v * -2147483648 FROM e ORDER BY id LIMIT 3",
    "SELECT id, n + 9223372036854775000 FROM e ORDER BY id LIMIT 3",
    "SELECT id, (v * 10000000000) * p FROM e ORDER BY id LIMIT 3",
])
def test_errors_a_sketch_could_skip_are_refused(sql: str) -> None:
    """Rule 5: PostgreSQL evaluates a top-k's select list for every row (every group) and
    every aggregate for every row; these may raise where the sketch reads nothing."""
    assert errors_verdict(sql) is not None


@pytest.mark.parametrize("sql", [
    "SELECT * FROM e ORDER BY id LIMIT 3",
    "SELECT id, g, s, v > 3 AS b, v::bigint, g::numeric, v::float8, f::text, s::varchar,"
    " s IS NULL, coalesce(v, n, 0), CASE WHEN v > 1 THEN w ELSE v END, v IN (1, 2),"
    " NOT (v > 1 OR s = 'a'), s COLLATE \"C\" FROM e ORDER BY id LIMIT 3",
    "SELECT id, v * 2 AS d FROM e ORDER BY id, d DESC LIMIT 3",
    "SELECT DISTINCT g, v * 2 AS d FROM e ORDER BY g LIMIT 3",
    "SELECT g, count(*), count(s), min(s), max(ts), sum(v), sum(n), avg(w) FROM e"
    " GROUP BY g HAVING count(*) > 3",
    "SELECT g, sum(f), max(10 / (v - 5)) FROM e GROUP BY g"
    " HAVING sum(f) > 3 AND max(10 / (v - 5)) > 1",
    "SELECT g, sum(v) / count(*) AS m, 10 / g FROM e GROUP BY g HAVING count(*) > 2",
    "SELECT g, sum(f) AS t, sum(f) * 2 AS x FROM e GROUP BY g ORDER BY x DESC, t LIMIT 2",
    "SELECT g, sum(v) / count(*) AS m FROM e GROUP BY g ORDER BY m DESC LIMIT 2",
    "SELECT id, v FROM e WHERE 10 / v > 1 ORDER BY id LIMIT 3",
    "SELECT g, count(*) FROM e WHERE ts::date > '2020-01-01' AND d::timestamp < ts"
    " AND date_trunc('day', ts)::date IS NOT NULL AND s::interval > '1 day'"
    " AND s::ext.citext = 'a' GROUP BY g HAVING count(*) > 1",
    "SELECT g, sum(p * (1 - q)), avg(p * q + v), min(-p), max(v * q - 1.5) FROM e"
    " GROUP BY g HAVING count(*) > 3",
    "SELECT id, p * (1 - q) AS r, -p, p * q > 10.5, p * q = v FROM e ORDER BY id LIMIT 3",
    "SELECT id, p * 10000000000, v * 9223372036854775808, p * 1.5e3 FROM e"
    " ORDER BY id LIMIT 3",
])
def test_expressions_that_cannot_raise_or_are_evaluated_anyway_are_kept(sql: str) -> None:
    """Plain columns and aggregates, widening casts, comparisons of one type family; and
    what the capture and the maintenance evaluate on every row or group anyway: WHERE,
    HAVING with its aggregates, ORDER BY keys. Also ``+ - *`` of ``numeric(p, s)`` and
    integer columns and numeric literals, each operation a numeric one: bounded digits."""
    assert errors_verdict(sql) is None


@pytest.mark.parametrize("sql", [
    "SELECT g, count(*) FROM e WHERE s::timestamptz > '2020-01-01' GROUP BY g"
    " HAVING count(*) > 0",
    "SELECT g, count(*) FROM e WHERE CAST(s AS date) IS NULL GROUP BY g",
    "SELECT g, count(*) FROM e WHERE (s || '')::time IS NULL GROUP BY g",
    "SELECT g, count(*) FROM e WHERE s::tstzrange IS NULL GROUP BY g",
    "SELECT g, count(*) FROM e WHERE s::timestamptz[] IS NULL GROUP BY g",
    "SELECT id, s FROM e ORDER BY id, upper(s)::timestamp LIMIT 3",
    "SELECT g, max(coalesce(s, '2020-01-01')::date) FROM e GROUP BY g HAVING count(*) > 1",
    "SELECT g, count(*) FROM e WHERE c::timestamptz IS NULL GROUP BY g",
    "SELECT g, count(*) FROM e WHERE s::public.stamp IS NULL GROUP BY g",
    "SELECT g, count(*) FROM e WHERE s::unknown_type IS NULL GROUP BY g",
])
def test_casts_of_stored_text_to_date_time_types_are_refused(sql: str) -> None:
    """A stored 'now' read as a date or time is another instant in every transaction while
    nothing is written, so no sketch of the query stays exact."""
    reason = errors_verdict(sql)
    assert reason is not None and "read the clock" in reason


@pytest.mark.parametrize(("declared", "tight"), [
    ("numeric(15, 2)", True), ("numeric(1000, 0)", True), ("numeric(1, 1)", True),
    ("numeric(3, -2)", False), ("numeric(2, 4)", False), ("numeric", False)])
def test_numeric_digits_bound_what_postgresql_holds(conn: psycopg.Connection[Any],
                                                    declared: str, tight: bool) -> None:
    """No value of the column has more digits before the point (``10 ^ whole`` does not
    fit: 22003) or after it than ``numeric_digits`` says; where the scale is between 0 and
    the precision, the largest value has exactly those. An unconstrained numeric has no
    bound."""
    conn.execute(f"CREATE TEMP TABLE nd (x {declared})")
    row = conn.execute("SELECT atttypmod FROM pg_attribute WHERE attrelid = 'nd'::regclass"
                       " AND attname = 'x'").fetchone()
    conn.execute("DROP TABLE nd")
    assert row is not None
    digits = numeric_digits(int(row[0]))
    if declared == "numeric":
        assert digits is None
        return
    assert digits is not None
    whole, scale = digits
    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        conn.execute(f"SELECT (10::numeric ^ {whole})::{declared}")
    tiny = conn.execute(f"SELECT scale(('0.' || repeat('0', 2000) || '1')::numeric::{declared})"
                        ).fetchone()
    assert tiny is not None and tiny[0] <= scale
    if tight:
        largest = f"(10::numeric ^ {whole} - 10::numeric ^ {-scale})"
        assert conn.execute(f"SELECT {largest}::{declared} = {largest}").fetchone()[0] is True
