"""Parsing helpers: templates, scopes, the printer round trip."""

from __future__ import annotations

import itertools

import pytest
from pglast import ast

from sketches.errors import UnsupportedQuery
from sketches.sql.parse import fingerprint, parse_select, print_checked, same_tree, scopes, tree_key


def test_fingerprint_abstracts_constants_and_parameters() -> None:
    a = fingerprint("SELECT g FROM t GROUP BY g HAVING count(*) > 5")
    assert a == fingerprint("select g from t group by g having count(*) > 700")
    assert a == fingerprint("SELECT g FROM t GROUP BY g HAVING count(*) > $1")
    assert a != fingerprint("SELECT g FROM t GROUP BY g HAVING sum(v) > 5")
    with pytest.raises(UnsupportedQuery):
        fingerprint("SELEC")


def test_scopes_are_numbered_in_pre_order() -> None:
    stmt = parse_select("SELECT 1 FROM (SELECT 1 FROM (SELECT 1 FROM c) AS b) AS a"
                        " JOIN (SELECT 1 FROM d) AS e ON true")
    names = [s.fromClause[0].relname if hasattr(s.fromClause[0], "relname") else None
             for s in scopes(stmt)]
    assert len(names) == 4
    assert names[2] == "c" and names[3] == "d"


def test_printer_roundtrip_keeps_parameters_and_literals() -> None:
    sql = "SELECT a FROM t WHERE s LIKE 'it''s%' AND b = $1 ORDER BY a LIMIT $2"
    assert print_checked(parse_select(sql)) == sql


@pytest.mark.parametrize("literal", ["0x10", "0o20", "0B10000", "1_0", "1_000.5"])
def test_literals_postgresql_15_rejects_are_refused(literal: str) -> None:
    """pglast parses with a newer grammar and prints such a literal as a decimal, so the
    rewritten query ran where PostgreSQL 15 raises 42601 (found: rows instead of the error)."""
    with pytest.raises(UnsupportedQuery, match="syntax error in PostgreSQL 15"):
        parse_select(f"SELECT g, count(*) FROM t GROUP BY g HAVING count(*) > {literal}")
    parse_select("SELECT g_1, count(*) FROM t_1 GROUP BY g_1 HAVING count(*) > 16.5e1")


@pytest.mark.parametrize("name", ["a" * 64, '"' + "A" * 64 + '"', '"' + "é" * 32 + '"',
                                  'U&"' + "d" * 64 + '"'])
def test_identifiers_postgresql_truncates_are_refused(name: str) -> None:
    """PostgreSQL truncates an identifier longer than 63 bytes with NOTICE 42622; pglast had
    truncated it already, so the rewritten query lost the NOTICE (found through the proxy)."""
    with pytest.raises(UnsupportedQuery, match="longer than 63 bytes"):
        parse_select(f"SELECT g AS {name}, count(*) FROM t GROUP BY g HAVING count(*) > 1")
    for fits in ("a" * 63, '"' + "é" * 31 + '"', '"' + '""' * 40 + '"'):
        parse_select(f"SELECT g AS {fits}, count(*) FROM t GROUP BY g HAVING count(*) > 1")


_TREES = [
    "SELECT g, sum(v) FROM t WHERE d >= 1 GROUP BY g HAVING sum(v) > 10",
    "select g,  sum(v) from t where d >= 1 group by g having sum(v) > 10",   # other positions
    "SELECT g, sum(v) FROM t WHERE d >= 2 GROUP BY g HAVING sum(v) > 10",
    "SELECT g, sum(v) FROM t WHERE d >= 1.0 GROUP BY g HAVING sum(v) > 10",
    "SELECT g, sum(v) FROM t WHERE d >= '1' GROUP BY g HAVING sum(v) > 10",
    "SELECT g, sum(v) FROM t WHERE d >= NULL GROUP BY g HAVING sum(v) > 10",
    "SELECT g, sum(v) FROM t WHERE d >= 0 GROUP BY g HAVING sum(v) > 10",
    "SELECT g, sum(v) FROM t WHERE d > 1 GROUP BY g HAVING sum(v) > 10",
    "SELECT g, sum(v) FROM t WHERE d >= $1 GROUP BY g HAVING sum(v) > 10",
    "SELECT g, sum(v) FROM t WHERE d >= $2 GROUP BY g HAVING sum(v) > 10",
    "SELECT g, sum(w) FROM t WHERE d >= 1 GROUP BY g HAVING sum(v) > 10",
    "SELECT g, sum(v) FROM t WHERE d >= 1 GROUP BY g HAVING sum(v) > 10 ORDER BY g",
    "SELECT g, sum(v) FROM t WHERE d >= 1 GROUP BY g HAVING sum(v) > 10 ORDER BY g DESC",
    "SELECT g, sum(v) FROM t WHERE d >= 1 GROUP BY g HAVING sum(v) > 10 LIMIT 0",
    "SELECT g, sum(v) FROM t WHERE d >= 1 GROUP BY g HAVING sum(v) > 10 LIMIT 5",
    "SELECT g, sum(v) FROM t WHERE d IN (1, 2) GROUP BY g HAVING sum(v) > 10",
    "SELECT g, sum(v) FROM t WHERE d IN (2, 1) GROUP BY g HAVING sum(v) > 10",
    "SELECT g, sum(DISTINCT v) FROM t WHERE d >= 1 GROUP BY g HAVING sum(v) > 10",
    "SELECT DISTINCT g, sum(v) FROM t WHERE d >= 1 GROUP BY g HAVING sum(v) > 10",
]


def test_tree_keys_are_equal_exactly_when_trees_are_the_same() -> None:
    """``tree_key`` stands in for ``same_tree`` when a query's skeleton is compared with
    kept sketches' (``template.reusable``): positions ignored, constants, parameters,
    operators and clauses not."""
    trees = [parse_select(sql) for sql in _TREES]
    built = ast.A_Const(val=ast.Integer(ival=0))   # by hand: isnull and location left unset
    parsed = parse_select("SELECT 0").targetList[0].val
    for a, b in [*itertools.product(trees, repeat=2), (built, parsed)]:
        assert (tree_key(a) == tree_key(b)) is same_tree(a, b), (a, b)
    assert same_tree(trees[0], trees[1]) and same_tree(built, parsed)
    assert sum(same_tree(a, b) for a, b in itertools.combinations(trees, 2)) == 1
