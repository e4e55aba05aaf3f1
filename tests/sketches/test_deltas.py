"""sketches.deltas against the real PostgreSQL: snapshot arithmetic, pushed-down filters and
fragment ids in the fetch, refusal outside a snapshot or after own writes; plus the pieces of
PostgreSQL semantics the engine reproduces in Python (avg's numeric division)."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql

import pg_extensions
from sketches import deltas
from sketches.ivm.ops.accumulators import pg_numeric_div
from sketches.ranges import RangePartition

Conn = psycopg.Connection[Any]
PART = RangePartition("public", "d", "a", "integer", (0, 10, 20), ("0", "10", "20"),
                      "{0,10,20}")


@pytest.fixture(scope="module")
def table(db_dsn: str) -> Iterator[str]:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        pg_extensions.install(c)
        c.execute("CREATE TABLE d (id int PRIMARY KEY, a int, b text)")
        c.execute("SELECT imp.track_table('d')")
    yield db_dsn


def rr(dsn: str) -> Conn:
    c = psycopg.connect(dsn)
    c.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    return c


def fetch_all(c: Conn, since: str) -> list[tuple[Any, ...]]:
    info = deltas.table_info(c, "d")
    frag = PART.fragment_sql(sql.Identifier("d", "a"))
    return sorted(deltas.fetch(c, info, "d", [sql.Identifier("d", "id"), frag], since,
                               [sql.SQL("d.b IS DISTINCT FROM 'skip'")]))


def test_delta_since_version_under_concurrency(table: str) -> None:
    with rr(table) as c:
        v0 = deltas.require_snapshot(c)
        c.commit()
    early = psycopg.connect(table)
    early.execute("INSERT INTO d VALUES (1, 5, 'x')")            # starts first, commits last
    with psycopg.connect(table, autocommit=True) as w:
        w.execute("INSERT INTO d VALUES (2, 25, 'y'), (3, NULL, 'z'), (4, -1, 'skip')")
    with rr(table) as c:
        v1 = deltas.require_snapshot(c)
        rows = fetch_all(c, v0)
        # early's insert is invisible here; 'skip' is filtered in SQL; NULL -> n + 1
        assert rows == [(2, 3, 1), (3, PART.null_fragment, 1)]
        c.commit()
    early.commit()
    early.close()
    with psycopg.connect(table, autocommit=True) as w:
        w.execute("UPDATE d SET a = 15 WHERE id = 2")
    with rr(table) as c:
        v2 = deltas.require_snapshot(c)
        rows = fetch_all(c, v1)
        assert rows == [(1, 1, 1), (2, 2, 1), (2, 3, -1)]
        assert deltas.pending(c, deltas.table_info(c, "d"), v1) == 3
        assert deltas.pending(c, deltas.table_info(c, "d"), v2) == 0
        c.commit()
    s0, s1, s2 = (deltas.Snapshot.parse(v) for v in (v0, v1, v2))
    assert s0.within(s1) and s1.within(s2) and s0.within(s2)
    assert not s2.within(s1)


def test_refuses_outside_snapshot_and_after_own_writes(table: str) -> None:
    with psycopg.connect(table, autocommit=True) as c, pytest.raises(deltas.SnapshotRequired):
        deltas.require_snapshot(c)
    with psycopg.connect(table) as c, pytest.raises(deltas.SnapshotRequired):
        deltas.require_snapshot(c)             # READ COMMITTED: one snapshot per statement
    with rr(table) as c:
        deltas.require_snapshot(c)
        info = deltas.table_info(c, "d")
        deltas.check_own_writes(c, info)
        c.execute("INSERT INTO d VALUES (100, 1, 'own')")
        with pytest.raises(deltas.OwnWrites):
            deltas.check_own_writes(c, info)
        c.rollback()
    with rr(table) as c, pytest.raises(deltas.NotTracked):
        deltas.table_info(c, "pg_class")


def test_pipelined_read_equals_probe_and_fetch(table: str) -> None:
    with rr(table) as c:
        v0 = deltas.require_snapshot(c)
        c.commit()
    with psycopg.connect(table, autocommit=True) as w:
        w.execute("INSERT INTO d VALUES (200, 7, 'pct%'), (201, 17, 'other')")
    with rr(table) as c:
        c.execute("SELECT 1")
        info = deltas.table_info(c, "d")
        # a literal % in pushed-down SQL must survive the parameterised query text
        q = deltas.delta_query(c, info, "d", [sql.Identifier("d", "id")],
                               [sql.SQL("d.b LIKE '%\\%'")])
        probe = deltas.probe(c, [info.relid])
        also = [deltas.Statement("SELECT pg_current_snapshot()::text, %s::int", (5,)),
                deltas.Statement("SELECT id FROM d WHERE id >= %s ORDER BY id", (200,))]
        batch = deltas.read_batch(c, [info.relid], [q], v0, also)
        assert batch is not None
        assert batch[0] == probe
        assert batch[1] == [deltas.fetch_query(c, q, v0)] == [[(200, 1)]]
        # the further reads ran in the same snapshot, their rows in the order asked
        assert batch[2] == [[(probe.snapshot, 5)], [(200,), (201,)]]
        c.commit()


def test_pipelined_read_failure_leaves_the_transaction_usable(table: str) -> None:
    """A query built for an audit table that is gone (here: never existed) makes the pipelined
    read fail in PostgreSQL; read_batch must roll back to its savepoint and answer None."""
    with rr(table) as c:
        v = deltas.require_snapshot(c)
        info = deltas.table_info(c, "d")
        gone = deltas.TableInfo(info.relid, "imp.no_such_audit_table", info.epoch)
        q = deltas.delta_query(c, gone, "d", [sql.Identifier("d", "id")])
        assert deltas.read_batch(c, [info.relid], [q], v) is None
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert deltas.require_snapshot(c) == v       # same transaction, same snapshot
        good = deltas.delta_query(c, info, "d", [sql.Identifier("d", "id")])
        bad = deltas.Statement("SELECT 1 FROM imp.no_such_table WHERE 1 = %s", (1,))
        assert deltas.read_batch(c, [info.relid], [good], v, [bad]) is None
        assert deltas.require_snapshot(c) == v
        c.commit()
    with psycopg.connect(table, autocommit=True) as c:
        assert deltas.read_batch(c, [1], [], "1:1:") is None   # not inside a transaction


def test_snapshot_within_matches_visibility() -> None:
    a = deltas.Snapshot.parse("10:15:11,13")
    assert [x for x in range(8, 17) if a.visible(x)] == [8, 9, 10, 12, 14]
    assert a.within(deltas.Snapshot.parse("10:15:11"))
    assert not a.within(deltas.Snapshot.parse("10:13:11"))     # 14 visible in a only
    assert not deltas.Snapshot.parse("10:15:").within(a)       # 11 and 13


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.one_of(st.integers(-10**6, 10**6),
                                 st.decimals(-1000, 1000, places=3)), min_size=1, max_size=7))
def test_avg_division_matches_postgres(admin_dsn: str, values: list[int | Decimal]) -> None:
    total = sum(values)
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        kind = "numeric" if any(isinstance(v, Decimal) for v in values) else "int"
        row = c.execute(sql.SQL("SELECT avg(x::{}) FROM unnest(%s::numeric[]) AS x")
                        .format(sql.SQL(kind)), ([Decimal(v) for v in values],)).fetchone()
    assert row is not None
    ours = pg_numeric_div(total, len(values))
    assert ours == row[0] and ours.as_tuple().exponent == row[0].as_tuple().exponent
