"""The never-wrong freshness rule: any foreign commit is a change; own and aborted are not."""

from __future__ import annotations

import psycopg

from sketches.freshness import changed_since, current_snapshot, current_xid


def test_unchanged_then_changed_by_a_commit(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE f (a int)")
        v = current_snapshot(conn)
        assert not changed_since(conn, v, ())
        conn.execute("INSERT INTO f VALUES (1)")
        assert changed_since(conn, v, ())


def test_aborted_transactions_are_not_changes(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn, psycopg.connect(db_dsn) as other:
        conn.execute("CREATE TABLE IF NOT EXISTS f (a int)")
        v = current_snapshot(conn)
        other.execute("INSERT INTO f VALUES (2)")
        other.rollback()
        assert not changed_since(conn, v, ())


def test_own_transactions_are_excluded(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn, psycopg.connect(db_dsn) as own:
        conn.execute("CREATE TABLE IF NOT EXISTS f (a int)")
        v = current_snapshot(conn)
        own.execute("INSERT INTO f VALUES (3)")
        xid = current_xid(own)
        own.commit()
        assert changed_since(conn, v, ())
        assert not changed_since(conn, v, {xid})


def test_older_snapshot_than_the_version_is_a_change(db_dsn: str) -> None:
    """A client snapshot taken before a commit that the sketch's version already sees."""
    with psycopg.connect(db_dsn, autocommit=True) as conn, psycopg.connect(db_dsn) as old:
        conn.execute("CREATE TABLE IF NOT EXISTS f (a int)")
        old.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        old.execute("SELECT 1")
        conn.execute("INSERT INTO f VALUES (4)")
        v = current_snapshot(conn)
        assert changed_since(old, v, ())
        old.rollback()


def test_in_progress_transaction_is_not_yet_a_change(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn, psycopg.connect(db_dsn) as other:
        conn.execute("CREATE TABLE IF NOT EXISTS f (a int)")
        other.execute("INSERT INTO f VALUES (5)")
        v = current_snapshot(conn)
        assert not changed_since(conn, v, ())  # invisible in both
        other.commit()
        assert changed_since(conn, v, ())


def test_horizon_bounds_the_check(db_dsn: str) -> None:
    """Past ``horizon`` xids the check gives up and reports a change (conservative)."""
    with psycopg.connect(db_dsn, autocommit=True) as conn, psycopg.connect(db_dsn) as other:
        conn.execute("CREATE TABLE IF NOT EXISTS f (a int)")
        v = current_snapshot(conn)
        for _ in range(3):
            other.execute("INSERT INTO f VALUES (6)")  # assigns an xid, then aborts
            other.rollback()
        assert not changed_since(conn, v, ())
        assert changed_since(conn, v, (), horizon=1)
