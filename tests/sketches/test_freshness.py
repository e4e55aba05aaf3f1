"""The never-wrong freshness rule: any foreign commit is a change; own and aborted are not."""

from __future__ import annotations

from typing import Any

import psycopg

from sketches.freshness import (
    changed_since,
    current_snapshot,
    current_xid,
    wrote_tables,
    wrote_user_data,
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


def test_rows_an_event_trigger_writes_in_the_managers_ddl_are_seen(fresh_db: Any) -> None:
    """A user's event trigger logging DDL into a table writes user rows in the manager's own
    DDL transactions (``ALTER TABLE … SET STATISTICS``): such a transaction is no
    catalog-only one, and a capture in it must not read the logged table. Rows of the
    manager's temporary tables and of schema imp are its own."""
    with psycopg.connect(fresh_db(), autocommit=True) as conn:
        conn.execute("CREATE SCHEMA imp")
        conn.execute("CREATE TABLE imp.mine (a int)")
        conn.execute("CREATE TABLE ddl_log (obj text)")
        conn.execute("CREATE TABLE other (a int)")
        log_id, other_id = (conn.execute(f"SELECT '{t}'::regclass::oid::int").fetchone()[0]
                            for t in ("ddl_log", "other"))
        conn.execute("CREATE FUNCTION log_ddl() RETURNS event_trigger LANGUAGE plpgsql AS $$"
                     " BEGIN INSERT INTO ddl_log SELECT object_identity"
                     " FROM pg_event_trigger_ddl_commands(); END $$")

        def alter_in_a_transaction() -> tuple[bool, bool, bool]:
            with conn.transaction(force_rollback=True):
                conn.execute("CREATE TEMP TABLE scratch (a int)")
                conn.execute("INSERT INTO scratch VALUES (1)")
                conn.execute("INSERT INTO imp.mine VALUES (1)")
                conn.execute("ALTER TABLE other ALTER COLUMN a SET STATISTICS 500")
                return (wrote_user_data(conn), wrote_tables(conn, [log_id]),
                        wrote_tables(conn, [other_id]))

        assert alter_in_a_transaction() == (False, False, False)
        conn.execute("CREATE EVENT TRIGGER log_ddl ON ddl_command_end"
                     " EXECUTE FUNCTION log_ddl()")
        try:
            assert alter_in_a_transaction() == (True, True, False)
            conn.execute("CREATE TABLE log_child () INHERITS (ddl_log)")
            conn.execute("CREATE OR REPLACE FUNCTION log_ddl() RETURNS event_trigger"
                         " LANGUAGE plpgsql AS $$ BEGIN INSERT INTO log_child"
                         " SELECT object_identity FROM pg_event_trigger_ddl_commands(); END $$")
            assert alter_in_a_transaction() == (True, True, False)   # through a child
        finally:
            conn.execute("DROP EVENT TRIGGER log_ddl")
