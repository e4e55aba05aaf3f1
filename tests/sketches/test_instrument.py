"""Instrumentation: predicate shape, placement, parameters, safety belt."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pglast import parse_sql

from sketches.errors import InstrumentationError
from sketches.instrument import instrument, skip_filter
from sketches.ranges import RangePartition
from sketches.sketch import SketchPart
from sketches.sql import TableRef
from sketches.sql.parse import print_checked, same_tree
from sketches.sql.rewrite import Range, Schemas, SkipFilter, add_skip_filters, print_skip_filters

P = RangePartition("public", "t", "a", "integer", (10, 20, 30, 40), ("10", "20", "30", "40"),
                   "{10,20,30,40}")
T = TableRef(0, None, "t", "t", 0)


def part(fragments: set[int], table: TableRef = T, nullable: bool = True) -> SketchPart:
    return SketchPart(table, "public", "a", P, frozenset(fragments), nullable)


def test_adjacent_fragments_merge_into_half_open_ranges() -> None:
    text = instrument("SELECT a FROM t", [part({0, 1, 3})])
    assert text == ("SELECT a FROM t WHERE t.a < CAST('20' AS integer)"
                    " OR (t.a >= CAST('30' AS integer) AND t.a < CAST('40' AS integer))")


NARROW = RangePartition("public", "t", "a", "integer", (10, 11, 12, 20, 21, 40),
                        ("10", "11", "12", "20", "21", "40"), "{10,11,12,20,21,40}")


def test_short_integer_runs_are_listed_in_one_any() -> None:
    """Runs spanning at most 4 integers become one ``= ANY`` (fewer nodes to print, re-parse
    and plan); longer runs and open ends stay ranges; the NULL test stays last."""
    p = SketchPart(T, "public", "a", NARROW, frozenset({1, 3, 4, 6, NARROW.null_fragment}),
                   True)
    text = instrument("SELECT a FROM t", [p])
    assert text == ("SELECT a FROM t WHERE t.a = ANY(CAST('{10}' AS integer[]))"
                    " OR (t.a >= CAST('12' AS integer) AND t.a < CAST('21' AS integer))"
                    " OR t.a >= CAST('40' AS integer) OR t.a IS NULL")
    p = SketchPart(T, "public", "a", NARROW, frozenset({1, 2, 4}), True)
    assert instrument("SELECT a FROM t", [p]) == (
        "SELECT a FROM t WHERE t.a = ANY(CAST('{10,11,20}' AS integer[]))")


@pytest.mark.parametrize("type_name", ["numeric", "text", "date"])
def test_only_integer_columns_are_listed(type_name: str) -> None:
    f = skip_filter(SketchPart(T, "public", "a", NARROW, frozenset({1}), False))
    text = add_skip_filters("SELECT a FROM t", [SkipFilter(
        f.scope, f.alias, f.column, type_name, f.ranges, f.include_null)])
    assert "ANY" not in text and ">=" in text


def test_open_upper_end_and_null_fragment() -> None:
    text = instrument("SELECT a FROM t WHERE b = 1", [part({4, 5})])
    assert text == ("SELECT a FROM t WHERE b = 1 AND (t.a >= CAST('40' AS integer)"
                    " OR t.a IS NULL)")


def test_empty_sketch_reads_nothing() -> None:
    assert instrument("SELECT a FROM t", [part(set())]) == "SELECT a FROM t WHERE FALSE"


def test_full_coverage_is_not_instrumented() -> None:
    assert instrument("SELECT a FROM t", [part({0, 1, 2, 3, 4, 5})]) is None
    assert instrument("SELECT a FROM t", [part({0, 1, 2, 3, 4}, nullable=False)]) is None
    assert instrument("SELECT a FROM t", [part({0, 1, 2, 3, 4})]) is not None


def test_predicate_goes_into_the_scope_of_the_table_with_its_alias() -> None:
    inner = TableRef(0, None, "t", "x", 1)
    text = instrument("SELECT q.a, count(*) FROM (SELECT x.a FROM t x WHERE x.b > $1) q"
                      " GROUP BY q.a HAVING count(*) > $2", [part({2}, inner)])
    assert text == ("SELECT q.a, count(*) FROM (SELECT x.a FROM t AS x WHERE x.b > $1"
                    " AND x.a >= CAST('20' AS integer) AND x.a < CAST('30' AS integer)) AS q"
                    " GROUP BY q.a HAVING count(*) > $2")


def test_existing_or_condition_is_kept_intact() -> None:
    text = instrument("SELECT a FROM t WHERE b = 1 OR c = 2", [part({1})])
    assert text is not None
    assert text.startswith("SELECT a FROM t WHERE (b = 1 OR c = 2) AND ")


def test_parameters_keep_working(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE t (a int, b int)")
    conn.execute("INSERT INTO t SELECT i, i % 3 FROM generate_series(0, 50) i")
    text = instrument("SELECT a FROM t WHERE b = $1 ORDER BY a LIMIT $2", [part({2})])
    assert text is not None
    with psycopg.RawCursor(conn) as cur:
        cur.execute(text, [1, 3])
        assert cur.fetchall() == [(22,), (25,), (28,)]


def test_text_literals_are_quoted() -> None:
    p = RangePartition("public", "t", "s", "text", ("it's", "z"), ("it's", "z"),
                       '{"it\'s",z}')
    f = skip_filter(SketchPart(T, "public", "s", p, frozenset({1})))
    assert f.ranges[0].lo == "it's"
    text = add_skip_filters("SELECT s FROM t", [f])
    assert "CAST('it''s' AS text)" in text


def test_safety_belt_rejects_trees_that_do_not_roundtrip() -> None:
    stmt = parse_sql("SELECT a FROM t WHERE b = 1")[0].stmt
    assert print_checked(stmt) == "SELECT a FROM t WHERE b = 1"
    stmt.whereClause = parse_sql("SELECT (1 + 2) * 3")[0].stmt.targetList[0].val
    stmt.whereClause.lexpr.rexpr.val.ival = 2  # still prints and reparses identically
    print_checked(stmt)
    bogus = parse_sql("SELECT a FROM t")[0].stmt
    bogus.whereClause = parse_sql("SELECT 1")[0].stmt  # a statement where an expr belongs
    with pytest.raises(InstrumentationError):
        print_checked(bogus)


def test_unknown_scope_raises() -> None:
    with pytest.raises(InstrumentationError):
        add_skip_filters("SELECT a FROM t", [SkipFilter(3, "t", "a", "integer", (), False)])


def test_same_tree_treats_unset_defaults_alike() -> None:
    a = parse_sql("SELECT 1 FROM t")[0].stmt
    b = parse_sql("SELECT  1  FROM  t")[0].stmt
    assert same_tree(a, b)
    assert not same_tree(a, parse_sql("SELECT 2 FROM t")[0].stmt)


_QUERIES = (
    ("SELECT a FROM t", ((0, "t"),)),
    ("SELECT a FROM t WHERE b = 1 OR c = 2", ((0, "t"),)),
    ("SELECT t.a, count(*) FROM t JOIN u ON t.a = u.x WHERE u.r < $1 GROUP BY t.a"
     " HAVING count(*) > $2", ((0, "t"), (0, "u"))),
    ("SELECT q.a, y.b FROM (SELECT x.a, x.b FROM t x WHERE x.b > 1 AND x.c < 2) q,"
     " (SELECT * FROM u) y WHERE q.a > y.b ORDER BY 2 DESC LIMIT 5",
     ((0, "y"), (1, "x"), (2, "u"))),
)
_BOUNDS = st.one_of(st.none(), st.integers(-5, 60).map(str),
                    st.text(alphabet="ab'\\\"% z", max_size=4))


@st.composite
def _filters(draw: st.DrawFn) -> tuple[str, list[SkipFilter], Schemas]:
    sql, aliases = draw(st.sampled_from(_QUERIES))
    schemas = tuple((scope, alias, draw(st.sampled_from(["public", "s2", "Odd Schema"])))
                    for scope, alias in aliases if draw(st.booleans()))
    out = []
    for _ in range(draw(st.integers(1, 3))):
        scope, alias = draw(st.sampled_from(aliases))
        type_name = draw(st.sampled_from(["integer", "bigint", "text", "numeric"]))
        ranges = draw(st.lists(st.builds(Range, _BOUNDS, _BOUNDS), max_size=6))
        if type_name != "text":
            ranges = [Range(*(b if b is None or b.lstrip("-").isdigit() else "7"
                              for b in (r.lo, r.hi))) for r in ranges]
        out.append(SkipFilter(scope, alias, draw(st.sampled_from(["a", "x"])),
                              type_name, tuple(ranges), draw(st.booleans())))
    return sql, out, schemas


@settings(max_examples=300, deadline=None)
@given(_filters())
def test_assembled_text_equals_the_whole_statement_printed(
        case: tuple[str, list[SkipFilter], Schemas]) -> None:
    """The placeholder assembly of :func:`add_skip_filters` gives exactly the text of printing
    the whole rewritten tree (:func:`print_skip_filters`): same parentheses, same literals,
    same qualified tables."""
    sql, filters, schemas = case
    assert add_skip_filters(sql, filters, schemas) == print_skip_filters(sql, filters, schemas)


def test_tables_are_qualified_with_the_schemas_resolved() -> None:
    """Each table named without a schema gets the one given for its (scope, alias), in joins
    and FROM subqueries; one the query qualifies keeps its own, and a subquery's alias is no
    table."""
    sql = ("SELECT q.a, u.x FROM (SELECT x.a FROM t x JOIN w ON w.k = x.a) q"
           " JOIN other.u ON u.x = q.a")
    f = SkipFilter(1, "x", "a", "integer", (Range("1", "5"),), False)
    schemas = ((1, "x", "Odd Schema"), (1, "w", "s2"), (0, "u", "s3"), (0, "q", "s4"))
    text = add_skip_filters(sql, [f], schemas)
    assert text == print_skip_filters(sql, [f], schemas)
    assert '"Odd Schema".t AS x' in text and "s2.w" in text and "other.u" in text
    assert "s3" not in text and "s4" not in text
