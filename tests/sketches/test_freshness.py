"""The never-wrong freshness rule: any foreign commit is a change; own and aborted are not."""

from __future__ import annotations

from typing import Any

import psycopg

from sketches.freshness import (
    changed_since,
    current_snapshot,
    current_xid,
    note_ddl,
    user_triggers_ran,
)


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


def test_the_managers_ddl_under_a_user_event_trigger_counts_as_a_change(fresh_db: Any) -> None:
    """A user's event trigger fires on the manager's own DDL (``note_ddl`` flags it): one
    keeping a DDL log wrote the capture's ``ALTER TABLE`` into the queried log (found by a
    helper's search of indirect writes, session 36); one that TRUNCATEs a partition or
    detaches it changes data no row count shows (found by the regression search of that
    fix), and one that then disables itself is gone when asked after the DDL (found by the
    regression search of the second fix). Such a transaction may have changed anything.
    Without the manager's DDL, or without a user's event trigger that fires in this
    session, it changed nothing."""
    dsn = fresh_db()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE pt (id int, v int) PARTITION BY RANGE (id)")
        conn.execute("CREATE TABLE pt1 PARTITION OF pt FOR VALUES FROM (0) TO (10)")
        conn.execute("INSERT INTO pt VALUES (1, 1), (2, 2)")
        conn.execute("CREATE TABLE other (a int)")
        conn.execute("CREATE FUNCTION empty_pt() RETURNS event_trigger LANGUAGE plpgsql AS $$"
                     " BEGIN TRUNCATE pt1; END $$")

        def alter(flagged: bool) -> tuple[int, bool]:
            with conn.transaction(force_rollback=True):
                if flagged:
                    note_ddl(conn)
                conn.execute("ALTER TABLE other ALTER COLUMN a SET STATISTICS 500")
                rows = conn.execute("SELECT count(*) FROM pt").fetchone()
                assert rows is not None
                return rows[0], user_triggers_ran(conn)

        assert alter(True) == (2, False)   # no user event trigger
        conn.execute("CREATE EVENT TRIGGER empty_pt ON ddl_command_end WHEN TAG IN"
                     " ('ALTER TABLE') EXECUTE FUNCTION empty_pt()")
        try:
            assert alter(True) == (0, True)
            assert alter(False) == (0, False)   # DDL the manager did not run
            with conn.transaction(force_rollback=True):
                note_ddl(conn)
            assert alter(False) == (0, False)   # the flag ended with its transaction
            conn.execute("ALTER EVENT TRIGGER empty_pt ENABLE REPLICA")   # not in origin
            assert alter(True) == (2, False)
            conn.execute("ALTER EVENT TRIGGER empty_pt ENABLE ALWAYS")
            assert alter(True) == (0, True)
            conn.execute("CREATE OR REPLACE FUNCTION empty_pt() RETURNS event_trigger"
                         " LANGUAGE plpgsql AS $$ BEGIN TRUNCATE pt1;"
                         " ALTER EVENT TRIGGER empty_pt DISABLE; END $$")
            assert alter(True) == (0, True)   # a one-shot trigger, gone when asked after
        finally:
            conn.execute("DROP EVENT TRIGGER empty_pt")
