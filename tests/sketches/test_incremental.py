"""Table tracking (sketches.incremental.track) and stored parameters' types against a real
PostgreSQL."""

from __future__ import annotations

import random

import psycopg
import pytest

from sketches import incremental
from sketches.deltas import Snapshot


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


def _visible_set(s: Snapshot, xids: range) -> set[int]:
    return {x for x in xids if s.visible(x)}


def _random_snapshot(rnd: random.Random, low: int = 3, high: int = 40) -> Snapshot:
    xmin = rnd.randint(low, high)
    xmax = rnd.randint(xmin, high + 5)
    return Snapshot(xmin, xmax, frozenset(x for x in range(xmin, xmax) if rnd.random() < 0.4))


@pytest.mark.parametrize("seed", range(5))
def test_join_sees_exactly_what_some_snapshot_sees(seed: int) -> None:
    """The garbage-collection watermark grows by :func:`incremental.join`: an xid is visible
    in the join exactly when one of the snapshots sees it (checked xid by xid, and for the
    snapshots' meet, which sees what all of them see); every snapshot is within the join."""
    rnd = random.Random(seed)
    xids = range(0, 60)
    for _ in range(200):
        snaps = [_random_snapshot(rnd) for _ in range(rnd.randint(1, 4))]
        joined = incremental.join(snaps)
        assert _visible_set(joined, xids) == set().union(*(_visible_set(s, xids) for s in snaps))
        assert all(s.within(joined) for s in snaps)
        assert all(joined.xmin <= x < joined.xmax for x in joined.xip)
        met = incremental.meet(snaps)
        assert _visible_set(met, xids) == set.intersection(*(_visible_set(s, xids)
                                                             for s in snaps))


@pytest.mark.parametrize(("a", "b", "joined"), [
    ("10:20:12,15", "10:20:15,17", "10:20:15"),   # 15 running in both
    ("10:12:", "15:30:16,25", "15:30:16,25"),      # the later one sees all the earlier does
    ("10:30:12,25", "20:20:", "20:30:25"),         # 12 is below the other's xmin: visible
    ("5:5:", "5:5:", "5:5:"),
])
def test_join_of_two_snapshots(a: str, b: str, joined: str) -> None:
    assert incremental.text(incremental.join([Snapshot.parse(a), Snapshot.parse(b)])) == joined


@pytest.mark.parametrize("seed", range(3))
def test_within_agrees_with_visibility(seed: int) -> None:
    """``Snapshot.within`` (with its shortcut for a range of newer xids longer than the
    running list) is the subset relation of the visible sets."""
    rnd = random.Random(seed)
    xids = range(0, 60)
    for _ in range(500):
        a, b = _random_snapshot(rnd), _random_snapshot(rnd)
        assert a.within(b) == (_visible_set(a, xids) <= _visible_set(b, xids)), (a, b)


def test_join_text_is_a_pg_snapshot(db_dsn: str) -> None:
    """PostgreSQL reads the join's text, and sees in it what the Python side sees."""
    joined = incremental.join([Snapshot.parse("10:30:12,25"), Snapshot.parse("20:28:21,26")])
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT x, pg_visible_in_snapshot(x::text::xid8, %s::pg_snapshot)"
                            " FROM generate_series(5, 35) x", (incremental.text(joined),)
                            ).fetchall()
    assert {int(x) for x, seen in rows if seen} == _visible_set(joined, range(5, 36))


def test_the_sql_join_is_the_python_join(db_dsn: str) -> None:
    """``imp.gc_deltas`` moves the watermark by ``imp._snapshot_join``, the SQL twin of
    :func:`incremental.join` (random pairs, compared as text)."""
    rnd = random.Random(7)
    pairs = [(_random_snapshot(rnd), _random_snapshot(rnd)) for _ in range(300)]
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        incremental.track(conn, [], incremental.SessionSettings.read(conn))   # installs imp
        got = conn.execute(
            "SELECT imp._snapshot_join(a::pg_snapshot, b::pg_snapshot)::text"
            " FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS p(a, b, i) ORDER BY i",
            ([incremental.text(a) for a, _ in pairs],
             [incremental.text(b) for _, b in pairs])).fetchall()
    assert [r[0] for r in got] == [incremental.text(incremental.join([a, b])) for a, b in pairs]


def test_a_collection_by_an_older_proxy_moves_the_watermark(db_dsn: str) -> None:
    """An older proxy on the same database calls ``imp.gc_deltas`` without writing the
    watermark itself (found by a helper's search of upgrades in session 26: the new proxy's
    state stepped over the collected rows, a group missing). The function moves it."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE inc_old_gc (id int PRIMARY KEY, v int)")
        incremental.track(conn, ["inc_old_gc"], incremental.SessionSettings.read(conn))
        conn.execute("INSERT INTO inc_old_gc SELECT i, i FROM generate_series(1, 5) i")
        bound = conn.execute("SELECT pg_current_snapshot()::text").fetchone()
        assert bound is not None
        row = conn.execute("SELECT imp.gc_deltas('inc_old_gc'::regclass, %s::pg_snapshot)",
                           bound).fetchone()
        assert row == (5,)
        assert _watermark(conn, "inc_old_gc") == bound[0]


def _watermark(conn: psycopg.Connection, table: str) -> str | None:
    row = conn.execute("SELECT bound::text FROM imp.collected WHERE relid = %s::regclass",
                       (table,)).fetchone()
    return None if row is None else str(row[0])


def _collect(conn: psycopg.Connection, low: int) -> int:
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        return incremental.collect_garbage(conn, {}, low)


def test_collections_move_the_watermark_and_a_concurrent_one_fails(db_dsn: str) -> None:
    """A collection that deletes audit rows records its bound in ``imp.collected``, joined
    with the watermark before (one that deletes nothing leaves it); of two collections at
    once the later fails (40001) rather than write a watermark missing the other's rows —
    the background thread's round fails and the next one collects."""
    with psycopg.connect(db_dsn, autocommit=True) as conn, \
            psycopg.connect(db_dsn, autocommit=True) as other:
        conn.execute("CREATE TABLE inc_collected (id int PRIMARY KEY, v int)")
        incremental.track(conn, ["inc_collected"], incremental.SessionSettings.read(conn))
        conn.execute("INSERT INTO inc_collected SELECT i, i FROM generate_series(1, 5) i")
        assert _collect(conn, incremental.horizon(conn)) >= 5
        first = _watermark(conn, "inc_collected")
        assert first is not None
        assert _collect(conn, incremental.horizon(conn)) == 0   # nothing left: no move
        assert _watermark(conn, "inc_collected") == first
        conn.execute("INSERT INTO inc_collected VALUES (6, 6)")
        low = incremental.horizon(conn)
        other.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        other.execute("SELECT 1")   # its snapshot: before the next collection commits
        assert _collect(conn, low) == 1
        second = _watermark(conn, "inc_collected")
        assert second is not None and second != first
        joined = incremental.join([Snapshot.parse(first), Snapshot.parse(second)])
        assert incremental.text(joined) == second   # the later bound sees all the first did
        with pytest.raises(psycopg.errors.SerializationFailure):
            incremental.collect_garbage(other, {}, low)
        other.execute("ROLLBACK")
        assert _watermark(conn, "inc_collected") == second


def test_a_collection_deletes_invalidated_sketches(db_dsn: str) -> None:
    """Every recapture invalidates the sketch it replaces; nothing read those rows again, and
    they piled up with their query texts and fragments (one per recapture). A collection
    deletes them and keeps the valid ones."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE inc_stale (id int PRIMARY KEY, v int)")
        incremental.track(conn, ["inc_stale"], incremental.SessionSettings.read(conn))
        ids = [conn.execute(
            "INSERT INTO imp.sketches (template, query_text, tables, attributes,"
            " partition_ids, version, valid) VALUES ('t', 'q', '{}', '{}', '{}',"
            " pg_current_snapshot(), %s) RETURNING id", (valid,)).fetchone()[0]  # type: ignore[index]
            for valid in (True, False, False)]
        _collect(conn, incremental.horizon(conn))
        left = conn.execute("SELECT id FROM imp.sketches WHERE id = ANY(%s) ORDER BY id",
                            (ids,)).fetchall()
        assert left == [(ids[0],)]


def test_an_audit_older_than_its_column_count_is_brought_up_to_date(db_dsn: str) -> None:
    """``imp.tracked_tables.natts`` (session 26) tells the DDL guard of a column dropped and
    added back in one ALTER TABLE. An install without it is not taken as installed, so the
    next tracking installs again; a table tracked before then is tracked afresh by its next
    such ALTER."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE inc_older (id int PRIMARY KEY, v int)")
        settings = incremental.SessionSettings.read(conn)
        incremental.track(conn, ["inc_older"], settings)
        conn.execute("ALTER TABLE imp.tracked_tables DROP COLUMN natts")
        conn.execute("UPDATE imp.schema_version SET checksum = 'older' WHERE version = 2")
        assert not incremental.installed(conn)
        conn.execute("CREATE TABLE inc_newer (id int PRIMARY KEY, v int)")
        incremental.track(conn, ["inc_newer"], settings)
        assert incremental.installed(conn)

        def epoch() -> object:
            return conn.execute("SELECT epoch FROM imp.tracked_tables"
                                " WHERE relid = 'inc_older'::regclass").fetchone()

        before = epoch()
        conn.execute("ALTER TABLE inc_older DROP COLUMN v, ADD COLUMN v int DEFAULT 1")
        assert epoch() != before
