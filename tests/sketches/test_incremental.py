"""Table tracking (sketches.incremental.track) against a real PostgreSQL."""

from __future__ import annotations

import psycopg

from sketches import incremental


def _own_xacts(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT count(*) FROM imp.own_xacts").fetchone()
    assert row is not None
    return int(row[0])


def test_tracking_a_tracked_table_again_commits_no_transaction(db_dsn: str) -> None:
    """The first tracking writes (audit table, triggers) and records its xid as the
    manager's own; tracking the same table again writes nothing and takes no xid, so no
    client's snapshot changes."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE inc_tracked (id int PRIMARY KEY, v int)")
        settings = incremental.SessionSettings.read(conn)
        incremental.track(conn, ["inc_tracked"], settings)
        first = _own_xacts(conn)
        assert first >= 1
        assert incremental.installed(conn)
        own_before = conn.execute(
            "SELECT max(xid::text::bigint) FROM imp.own_xacts").fetchone()
        incremental.track(conn, ["inc_tracked"], settings)
        assert _own_xacts(conn) == first
        assert conn.execute("SELECT max(xid::text::bigint) FROM imp.own_xacts"
                            ).fetchone() == own_before
        row = conn.execute("SELECT count(*) FROM imp.tracked_tables"
                           " WHERE relid = 'inc_tracked'::regclass").fetchone()
        assert row == (1,)
