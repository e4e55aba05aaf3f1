"""analyse(): the flattened QueryAnalysis of supported queries, reasons for the rest."""

from __future__ import annotations

import pytest

from sketches.errors import NeedsCatalog, UnsupportedQuery
from sketches.sql import ColumnRef, analyse

COLUMNS = {"t": ["id", "g", "v", "s", "d"], "dim": ["id", "k", "cat", "w"],
           "u": ["a", "b"]}


def resolver(schema: str | None, table: str) -> list[str] | None:
    return COLUMNS.get(table)


def test_single_table_having() -> None:
    a = analyse("SELECT g, count(*) AS c, sum(v + 1) FROM t WHERE v > 3 AND s LIKE 'a%'"
                " GROUP BY g HAVING count(*) > $1")
    assert [t.name for t in a.tables] == ["t"]
    assert [e.sql for e in a.where] == ["t.v > 3", "t.s LIKE 'a%'"]
    assert [e.column for e in a.group_by] == [ColumnRef(0, "g")]
    assert {(c.func, c.arg.sql if c.arg else None) for c in a.aggregates} == {
        ("count", None), ("sum", "t.v + 1")}
    assert a.having is not None and a.having.sql == "count(*) > $1" and a.having.has_aggregate
    assert a.params == (1,)
    assert a.is_aggregate and not a.is_topk
    assert [i.name for i in a.select] == ["g", "c", "sum"]


def test_joins_and_equalities() -> None:
    a = analyse("SELECT t.g, count(*) FROM t JOIN dim d ON t.g = d.k AND d.w > 2, u"
                " WHERE u.a = t.v AND (t.s = 'x' OR u.b = 1) GROUP BY t.g", resolver)
    assert [(t.name, t.alias) for t in a.tables] == [("t", "t"), ("dim", "d"), ("u", "u")]
    assert a.join_equalities == ((ColumnRef(0, "g"), ColumnRef(1, "k")),
                                 (ColumnRef(2, "a"), ColumnRef(0, "v")))
    assert [e.sql for e in a.where] == ["d.w > 2", "t.s = 'x' OR u.b = 1"]


def test_unqualified_columns_in_joins_need_the_catalog() -> None:
    sql = "SELECT g, count(*) FROM t, dim WHERE g = k GROUP BY g"
    with pytest.raises(NeedsCatalog):
        analyse(sql)
    a = analyse(sql, resolver)
    assert a.join_equalities == ((ColumnRef(0, "g"), ColumnRef(1, "k")),)
    assert a.resolved


def test_ambiguous_column_is_unsupported() -> None:
    with pytest.raises(UnsupportedQuery, match="ambiguous"):
        analyse("SELECT id FROM t, dim ORDER BY id LIMIT 1", resolver)


def test_subquery_in_from_is_inlined() -> None:
    a = analyse("SELECT q.key, sum(q.val) FROM (SELECT t.g AS key, v AS val FROM t"
                " WHERE v > 0) q JOIN dim ON q.key = dim.k GROUP BY q.key ORDER BY 2 DESC"
                " LIMIT 3")
    assert [(t.alias, t.scope) for t in a.tables] == [("t", 1), ("dim", 0)]
    assert a.scopes[1].parent == 0 and a.scopes[1].alias == "q"
    assert a.join_equalities == ((ColumnRef(0, "g"), ColumnRef(1, "k")),)
    assert [e.sql for e in a.where] == ["t.v > 0"]
    assert a.group_by[0].column == ColumnRef(0, "g")
    assert a.order_by[0].output == 1 and a.order_by[0].descending
    assert a.order_by[0].expr.sql == "sum(t.v)"
    assert a.limit is not None and a.limit.value == 3


def test_order_by_alias_position_and_nulls() -> None:
    a = analyse("SELECT g, count(*) AS c FROM t GROUP BY g ORDER BY c DESC, 1 NULLS FIRST"
                " LIMIT $2")
    first, second = a.order_by
    assert first.expr.sql == "count(*)" and first.descending and first.nulls_first
    assert second.expr.column == ColumnRef(0, "g") and not second.descending
    assert second.nulls_first
    assert a.limit is not None and a.limit.param == 2 and a.limit.resolve([0, 7]) == 7


def test_group_by_output_alias() -> None:
    a = analyse("SELECT g AS grp, count(*) FROM t GROUP BY grp", resolver)
    assert a.group_by[0].column == ColumnRef(0, "g")


def test_distinct_and_star() -> None:
    a = analyse("SELECT DISTINCT s FROM t")
    assert a.distinct and a.select[0].expr is not None
    b = analyse("SELECT * FROM t ORDER BY v LIMIT 2")
    assert b.select[0].star and b.is_topk


@pytest.mark.parametrize(("sql", "reason"), [
    ("SELECT 1", "no FROM clause"),
    ("WITH x AS (SELECT 1) SELECT * FROM x", "WITH"),
    ("SELECT g FROM t UNION SELECT k FROM dim", "set operation"),
    ("SELECT g FROM t LEFT JOIN dim ON t.g = dim.k", "outer join"),
    ("SELECT g FROM t JOIN dim USING (id)", "USING"),
    ("SELECT g FROM t WHERE v IN (SELECT w FROM dim)", "subquery in an expression"),
    ("SELECT g FROM t WHERE d > now()", "function now"),
    ("SELECT g FROM t WHERE d > CURRENT_DATE", "CURRENT_DATE"),
    ("SELECT g, row_number() OVER () FROM t", "window"),
    ("SELECT g FROM t ORDER BY g LIMIT 1 OFFSET 2", "OFFSET"),
    ("SELECT DISTINCT ON (g) g FROM t", "DISTINCT ON"),
    ("SELECT g, count(*) FROM t GROUP BY ROLLUP (g)", "GROUPING SETS"),
    ("SELECT g, sum(v) FILTER (WHERE v > 0) FROM t GROUP BY g", "FILTER"),
    ("SELECT q.g FROM (SELECT g, count(*) FROM t GROUP BY g) q", "aggregation in a FROM"),
    ("SELECT q.g FROM (SELECT g FROM t LIMIT 3) q", "LIMIT in a FROM"),
    ("SELECT x.g FROM t x, LATERAL (SELECT 1) l", "LATERAL"),
    ("SELECT g FROM t FOR UPDATE", "FOR UPDATE"),
    ("INSERT INTO t VALUES (1)", "not a SELECT"),
    ("SELECT 1; SELECT 2", "not exactly one statement"),
    ("SELEC broken", "parse error"),
    ("SELECT g FROM t x, t x", "used twice"),
    ("SELECT string_agg(s, ',') FROM t", "function string_agg"),
    ("SELECT g FROM generate_series(1, 3) g", "FROM item"),
    ("SELECT g FROM t ORDER BY g FETCH FIRST 2 ROWS WITH TIES", "WITH TIES"),
    ("SELECT g, count(*) FROM t WHERE s @@ 'the' GROUP BY g", "text search operator @@"),
    ("SELECT g, count(*) FROM t WHERE s @@@ 'cat' GROUP BY g", "text search operator @@@"),
])
def test_unsupported_queries_name_a_reason(sql: str, reason: str) -> None:
    with pytest.raises(UnsupportedQuery) as info:
        analyse(sql, resolver)
    assert str(info.value).startswith("unsupported: ")
    assert reason in info.value.reason


def test_lenient_analysis_runs_every_syntactic_check_without_the_catalog() -> None:
    with pytest.raises(UnsupportedQuery, match="function random"):
        analyse("SELECT random(), g FROM t, dim WHERE g = k GROUP BY g", lenient=True)
    a = analyse("SELECT g FROM t, dim WHERE g = k GROUP BY g", lenient=True)
    assert not a.resolved


def test_names_looked_up_on_the_search_path_are_collected() -> None:
    """The functions called unqualified and the operators used (BETWEEN: >= and <=, LIKE:
    ~~): PostgreSQL resolves them through the session's search_path."""
    a = analyse("SELECT g, sum(v), max(round(v)) FROM t WHERE v BETWEEN 1 AND 5"
                " AND g IN (1, 2) AND s LIKE 'a%' AND pg_catalog.abs(v) > 0 GROUP BY g"
                " HAVING count(*) <> 3")
    assert a.routines == {"sum", "max", "round", "count"}
    assert a.operators == {">=", "<=", "=", "~~", ">", "<>"}


@pytest.mark.parametrize("sql", ["SELECT g, count(*) FROM t WHERE v = NULL GROUP BY g",
                                 "SELECT g, count(*) FROM t GROUP BY g HAVING NULL = max(v)"])
def test_equals_null_is_refused(sql: str) -> None:
    """A session with transform_null_equals reads ``x = NULL`` as ``x IS NULL``; the service
    connection does not (the setting is not reported to the proxy)."""
    with pytest.raises(UnsupportedQuery, match="transform_null_equals"):
        analyse(sql)
    analyse(sql.replace("NULL", "NULL::int"))   # a typed NULL is never transformed


@pytest.mark.parametrize("sql", [
    "SELECT g, count(*) FROM t WHERE ts < 'now' GROUP BY g",
    "SELECT g, count(*) FROM t WHERE d >= 'Today'::date GROUP BY g",
    "SELECT g, count(*) FROM t WHERE ts < timestamptz 'tomorrow 10:00' GROUP BY g",
    "SELECT g, count(*) FROM t WHERE d = ANY('{2020-01-01, yesterday}') GROUP BY g",
    "SELECT g, max(ts) FROM t GROUP BY g HAVING max(ts) > ' NOW '",
])
def test_literals_that_read_the_clock_are_refused(sql: str) -> None:
    """PostgreSQL reads 'now', 'today', 'tomorrow' and 'yesterday' as the transaction's time
    or date: the same text asks something else later, so no sketch may carry over."""
    with pytest.raises(UnsupportedQuery, match="reads the clock"):
        analyse(sql)


@pytest.mark.parametrize("cast", ["'u'::regclass", "'int4'::pg_catalog.regtype",
                                  "CAST('public' AS regnamespace)"])
def test_casts_that_look_names_up_are_refused(cast: str) -> None:
    with pytest.raises(UnsupportedQuery, match="reads the catalog"):
        analyse(f"SELECT g, count(*) FROM t WHERE k = {cast}::oid GROUP BY g")


def test_names_and_words_containing_clock_words_are_kept() -> None:
    analyse("SELECT \"now\", count(*) FROM t WHERE \"today\" > 1 AND name = 'Snowden'"
            " GROUP BY \"now\"")


def test_the_types_of_casts_are_collected() -> None:
    """A cast's type name, as PostgreSQL will look it up (qualified when written so): the
    operators applied to its values depend on it."""
    a = analyse("SELECT g, sum(v::numeric(10, 2)) FROM t WHERE s::ext.citext = 'a'"
                " AND v = ANY('{1}'::int[]) GROUP BY g")
    assert a.types == {"numeric(10, 2)", "ext.citext", "integer[]"}
    with pytest.raises(UnsupportedQuery):
        analyse("SELECT g, count(*) FROM t WHERE s::db.ext.citext = 'a' GROUP BY g")


@pytest.mark.parametrize("sql", ['SELECT g, "SUM"(v) FROM t GROUP BY g',
                                 "SELECT g, sum(v) FROM t GROUP BY g HAVING sum(v)"
                                 " OPERATOR(mine.>) 3",
                                 "SELECT g, mine.sum(v) FROM t GROUP BY g"])
def test_quoted_or_qualified_names_are_not_the_built_ins(sql: str) -> None:
    with pytest.raises(UnsupportedQuery):
        analyse(sql)


@pytest.mark.parametrize("sql", ["SELECT *, v FROM t ORDER BY 2, id LIMIT 3",
                                 "SELECT g, *, v FROM t ORDER BY 3 LIMIT 3",
                                 "SELECT *, g FROM t GROUP BY 2"])
def test_positions_from_a_star_on_are_refused(sql: str) -> None:
    """A ``*`` is as many output columns as its tables have: ``ORDER BY 2`` after it names
    the table's second column, not the next select item."""
    with pytest.raises(UnsupportedQuery, match="before its first"):
        analyse(sql, resolver)


def test_positions_before_a_star_are_kept() -> None:
    a = analyse("SELECT v, * FROM t ORDER BY 1, id LIMIT 3", resolver)
    assert a.order_by[0].expr.column == ColumnRef(0, "v") and a.order_by[0].output == 0
