"""Library callers' transactions around ``SketchManager.prepare``: a transaction that has
written passes its queries through (its own writes are visible to it but in no snapshot),
also when the writes follow the manager's own in an earlier prepare of the transaction; a
maintained sketch finds them in the audit (``OwnWrites``); a savepoint rolled back leaves the
answers exact."""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg
import pytest

from sketches.manager import SketchManager
from tests.sketches.test_background_builds import COLS, ROWS, conn, db, manager, q
from tests.sketches.test_manager_ivm import check, fresh_table

__all__ = ["conn", "db"]   # the fixtures, shared with the background builds' tests

Conn = psycopg.Connection[Any]

HIGH = (2850,)   # groups 7, 17, 27, 37 only

# group 0 reaches the threshold only through these rows
GROUP0 = "INSERT INTO {t} SELECT 910000 + i, 0, 49, 1 FROM generate_series(1, 30) i"


def plain_table(conn: Conn, name: str) -> None:
    """Not tracked (a lazy manager keeps its sketches by recapture until tracked)."""
    conn.execute(f"DROP TABLE IF EXISTS {name}")
    conn.execute(f"CREATE TABLE {name} ({COLS})")
    conn.execute(f"INSERT INTO {name} {ROWS}")
    conn.execute(f"ANALYZE {name}")


def both(m: SketchManager, conn: Conn, sql: str, params: tuple[object, ...]) -> Any:
    """prepare (without snapshot: the library's own setup round trip) and the oracle, in
    conn's current transaction."""
    p = m.prepare(conn, sql, list(params))
    with psycopg.RawCursor(conn) as cur:
        original = Counter(cur.execute(sql, params).fetchall())
        if p.instrumented_sql is not None:
            got = Counter(cur.execute(p.instrumented_sql, params).fetchall())
            assert got == original, (p, got, original)
    return p


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "READ COMMITTED"])
@pytest.mark.parametrize("how", ["recapture", "lazy-untracked"])
def test_writes_after_a_capture_in_the_same_transaction(conn: Conn, how: str,
                                                        isolation: str) -> None:
    """BEGIN; the query (captured: the manager's catalog write gives the transaction an xid
    recorded as the manager's own); the caller's INSERT (same xid); the query again, which
    now passes through (found by a regression search in session 28: the sketch was used and
    left group 0, made by the INSERT alone, out). Such writes are outside ``prepare``'s
    contract (a fresh transaction, committed right after: INTERFACES.md); after a COMMIT
    they stay unseen by the snapshot rule, as documented there."""
    table = f"own_{how.split('-')[0]}_{isolation.split()[0].lower()}"
    plain_table(conn, table)
    sql = q(table)
    with manager(conn, strategy=how.split("-")[0]) as m:
        conn.execute(f"BEGIN ISOLATION LEVEL {isolation}")
        try:
            assert both(m, conn, sql, HIGH).decision == "capture"
            conn.execute(GROUP0.format(t=table))
            both(m, conn, sql, HIGH)
        finally:
            conn.execute("ROLLBACK")


def test_writes_after_a_capture_lazy_tracked(conn: Conn) -> None:
    """Control: a maintained sketch finds the transaction's audit rows (OwnWrites)."""
    table = "own_tracked"
    fresh_table(conn, table, COLS, ROWS)
    sql = q(table)
    with manager(conn) as m:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        try:
            assert both(m, conn, sql, HIGH).decision == "capture"
            conn.execute(GROUP0.format(t=table))
            assert both(m, conn, sql, HIGH).decision == "passthrough"
        finally:
            conn.execute("ROLLBACK")
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        both(m, conn, sql, HIGH)
        conn.execute(GROUP0.format(t=table))
        conn.execute("COMMIT")
        m.committed()
        check(m, conn, sql, HIGH)


@pytest.mark.parametrize("how", ["recapture", "lazy-untracked"])
def test_savepoint_rolled_back_after_a_capture(conn: Conn, how: str) -> None:
    table = f"own_sp_{how.split('-')[0]}"
    plain_table(conn, table)
    sql = q(table)
    with manager(conn, strategy=how.split("-")[0]) as m:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        try:
            assert both(m, conn, sql, HIGH).decision == "capture"
            conn.execute("SAVEPOINT a")
            conn.execute(f"DELETE FROM {table} WHERE g = 7")
            conn.execute("ROLLBACK TO SAVEPOINT a")
            both(m, conn, sql, HIGH)
        finally:
            conn.execute("ROLLBACK")
