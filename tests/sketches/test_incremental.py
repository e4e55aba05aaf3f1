"""Table tracking (sketches.incremental.track) and stored parameters' types against a real
PostgreSQL."""

from __future__ import annotations

import psycopg
import pytest

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


@pytest.mark.parametrize(("x32", "ref", "full"), [
    (800, 804, 800),                          # an older xid of this epoch
    (805, 804, 805),                          # newer than the snapshot (a race): not 2^32 older
    (2**32 - 3, 2**32 + 5, 2**32 - 3),        # the previous epoch
    (3, 2**32 - 2, 2**32 + 3),                # the next epoch
])
def test_a_32_bit_xid_widens_to_the_full_xid_nearest_the_snapshot(x32: int, ref: int,
                                                                  full: int) -> None:
    """``pg_stat_activity``'s xids are 32-bit; one newer than the snapshot that gave ``ref``
    was taken as 2^32 older: the GC horizon became negative, PostgreSQL read the bound as a
    huge snapshot and every audit row was deleted, also rows a state had still to read
    (found by a fuzz of eager maintenance over joins: a committed transaction's rows missed,
    a group missing)."""
    assert incremental.widen(x32, ref) == full
