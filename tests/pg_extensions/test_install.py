"""pg_extensions.install: in its own transaction, or as part of the caller's."""

from __future__ import annotations

from typing import Any

import psycopg

import pg_extensions


def _drop_imp(conn: psycopg.Connection[Any]) -> None:
    conn.execute("DROP SCHEMA IF EXISTS imp CASCADE")


def test_install_inside_a_transaction_writes_under_its_xid(db_dsn: str) -> None:
    """Inside the caller's transaction the migrations are that transaction's own writes —
    no savepoint, whose subtransaction xid the caller's record of its own xid would miss —
    and a rollback takes them away."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        _drop_imp(conn)
        conn.execute("BEGIN")
        applied = pg_extensions.install(conn)
        assert applied == [m.name for m in pg_extensions.migrations()]
        row = conn.execute("SELECT pg_current_xact_id()::text,"
                           " array_agg(DISTINCT xmin::text) FROM imp.schema_version").fetchone()
        assert row is not None and row[1] == [row[0]]
        conn.execute("ROLLBACK")
        gone = conn.execute("SELECT to_regclass('imp.schema_version')").fetchone()
        assert gone == (None,)


def test_install_in_autocommit_commits_by_itself(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        _drop_imp(conn)
        assert pg_extensions.install(conn)
    with psycopg.connect(db_dsn, autocommit=True) as other:
        n = other.execute("SELECT count(*) FROM imp.schema_version").fetchone()
        assert n == (len(pg_extensions.migrations()),)
        assert pg_extensions.install(other) == []


def test_a_reinstall_never_repeats_a_tracked_tables_epoch(db_dsn: str) -> None:
    """Epochs tell a state built under one tracking of a table from any later tracking; a
    schema dropped and installed again must not hand out the same epochs again."""
    epochs = []
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS re_t (id int)")
        for _ in range(3):
            _drop_imp(conn)
            pg_extensions.install(conn)
            conn.execute("SELECT imp.track_table('re_t'::regclass)")
            row = conn.execute("SELECT epoch FROM imp.tracked_tables"
                               " WHERE relid = 're_t'::regclass").fetchone()
            assert row is not None
            epochs.append(int(row[0]))
    assert len(set(epochs)) == len(epochs), epochs
