"""Safety rules (DESIGN §4 and the extensions proved in sketches/safety.py)."""

from __future__ import annotations

import random
from typing import Any

import psycopg
import pytest

from sketches.capture import CaptureTarget, capture
from sketches.instrument import instrument
from sketches.ranges import build_partition
from sketches.safety import check, equivalence_classes, exact_equalities
from sketches.sql import ColumnRef, analyse

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
