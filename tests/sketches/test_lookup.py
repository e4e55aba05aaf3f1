"""sketches.lookup against the real PostgreSQL: which queries depend on the role that runs
them (row-level security on any joined table, a view), read in one statement."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from sketches import lookup
from sketches.sql import analyse


@pytest.fixture(scope="module")
def conn(db_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("CREATE SCHEMA IF NOT EXISTS lk")
        c.execute("CREATE TABLE lk.plain (id int, g int, v int)")
        c.execute('CREATE TABLE lk."Guarded" (id int, pid int, w int)')
        c.execute('ALTER TABLE lk."Guarded" ENABLE ROW LEVEL SECURITY')
        c.execute("CREATE VIEW lk.shown AS SELECT id, g, v FROM lk.plain")
        yield c
        c.execute("DROP SCHEMA lk CASCADE")


@pytest.mark.parametrize(("sql", "verdict"), [
    ("SELECT g, sum(v) FROM lk.plain GROUP BY g HAVING sum(v) > 3", None),
    ('SELECT p.g, sum(q.w) FROM lk.plain p, lk."Guarded" q WHERE p.id = q.pid GROUP BY p.g'
     " HAVING sum(q.w) > 3", "Guarded has row-level security"),
    ('SELECT q.pid, count(*) FROM lk."Guarded" q, lk.plain p WHERE p.id = q.pid'
     " GROUP BY q.pid HAVING count(*) > 1", "Guarded has row-level security"),
    ("SELECT g, sum(v) FROM lk.shown GROUP BY g HAVING sum(v) > 3", "shown is a view"),
    ("SELECT g, sum(v) FROM plain GROUP BY g HAVING sum(v) > 3", None),  # not on the path
])
def test_role_dependent(conn: psycopg.Connection[Any], sql: str, verdict: str | None) -> None:
    got = lookup.role_dependent(conn, analyse(sql, lenient=True))
    assert got == verdict if verdict is None else got is not None and got.startswith(verdict)


def test_role_dependent_once_search_path_finds_the_table(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SET search_path = lk, public")
    try:
        sql = "SELECT g, sum(v) FROM shown GROUP BY g HAVING sum(v) > 3"
        got = lookup.role_dependent(conn, analyse(sql, lenient=True))
        assert got is not None and got.startswith("shown is a view")
    finally:
        conn.execute("RESET search_path")
