"""The batch plan: what is pushed down to PostgreSQL, what is refused, and JDBC partition
predicates that cover every row exactly once."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg import sql

from sketches.backends.base import BackendUnsupported
from sketches.backends.plan import Bin, BoolOp, IsNull, Lit, Ref, build_plan, inline_params
from sketches.backends.plan import translate as translate_expr
from tests.sketches.backends.helpers import targets_for


@pytest.fixture
def tables(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute("DROP TABLE IF EXISTS r, s")
    conn.execute("CREATE TABLE r (id int, g int, t text, d date, v int)")
    conn.execute(
        "INSERT INTO r SELECT i, i % 7, CASE WHEN i % 5 = 0 THEN NULL ELSE 'k' || (i % 23) END,"
        " CASE WHEN i % 11 = 0 THEN NULL ELSE date '2021-01-01' + i END, i"
        " FROM generate_series(1, 300) i")
    conn.execute("CREATE TABLE s (x int, label text)")
    conn.execute("ANALYZE r")
    return conn


def test_translate_having() -> None:
    names = {"sum(r.v)": "a0", "count(*)": "a1", "r.g": "e0"}
    node = translate_expr("sum(r.v) > $1 AND (count(*) * 2 >= 3.5 OR r.g IS NULL)", names,
                          frozenset(), (7,))
    assert node == BoolOp("and", (
        Bin(">", Ref("a0"), Lit(7)),
        BoolOp("or", (Bin(">=", Bin("*", Ref("a1"), Lit(2)), Lit(Decimal("3.5"))),
                      IsNull(Ref("e0"), False)))))
    for refused in ("avg(r.v) > 1", "sum(r.v) / 2 > 1", "lower(r.t) = 'a'", "sum(r.v) > 'x'",
                    "sum(r.v) > 1::numeric", "max(r.v) > $1"):
        with pytest.raises(BackendUnsupported):
            translate_expr(refused, names, frozenset({"avg(r.v)"}), ("text",))


def test_inline_params_keeps_literal_dollars(tables: psycopg.Connection[Any]) -> None:
    original = "(r.t <> '$1') AND (r.v > $1) AND (r.d < $2) AND (r.t <> $3)"
    params = (5, dt.date(2021, 3, 1), "it's")
    text = inline_params(original, tables, params)
    assert "'$1'" in text and "$2" not in text and "$3" not in text
    inlined = tables.execute(
        sql.SQL("SELECT count(*) FROM r WHERE {}").format(sql.SQL(text))).fetchone()
    with psycopg.RawCursor(tables) as cur:
        cur.execute("SELECT count(*) FROM r WHERE " + original, params)
        bound = cur.fetchone()
    assert inlined == bound and bound is not None and bound[0] > 0
    with pytest.raises(BackendUnsupported):
        inline_params("r.v > $2", tables, (1,))


@pytest.mark.parametrize("column", ["t", "d", "v"])
@pytest.mark.parametrize("parts", [1, 2, 3, 50])
def test_partition_predicates_cover_every_row_once(tables: psycopg.Connection[Any],
                                                   column: str, parts: int) -> None:
    text = f"SELECT DISTINCT r.{column} FROM r WHERE r.id > $1"
    analysis, targets = targets_for(tables, text, 6)
    plan = build_plan(tables, analysis, targets, (10,), ["public"])
    (read,) = plan.reads
    predicates = read.partition_predicates(parts)
    assert len(predicates) == (0 if parts == 1 else min(parts, targets[0].partition.n + 1))
    if not predicates:
        return
    total = tables.execute("SELECT count(*) FROM r WHERE id > 10").fetchone()
    hits = sql.SQL(" + ").join(sql.SQL("(CASE WHEN {} THEN 1 ELSE 0 END)").format(p)
                               for p in predicates)
    row = tables.execute(sql.SQL(
        "SELECT count(*), count(*) FILTER (WHERE ({hits}) <> 1) FROM ({q}) AS q").format(
        hits=hits, q=read.query())).fetchone()
    assert row == (total[0] if total else None, 0)


def test_refusals(tables: psycopg.Connection[Any]) -> None:
    for text in ("SELECT r.g, sum(r.v * s.x) FROM r JOIN s ON r.g = s.x GROUP BY r.g",
                 "SELECT r.g, count(*) FROM r JOIN s ON r.g = s.x WHERE r.v < s.x"
                 " GROUP BY r.g",
                 "SELECT r.g, count(DISTINCT r.v) FROM r GROUP BY r.g"):
        analysis, targets = targets_for(tables, text, 4)
        with pytest.raises(BackendUnsupported):
            build_plan(tables, analysis, targets, None, ["public", "public"][:len(
                analysis.tables)])
