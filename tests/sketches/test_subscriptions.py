"""Tables written by a logical-replication subscription.

PostgreSQL's apply worker fires only row-level triggers, so the audit's statement-level
triggers never see a replicated write. Found by a regression search (session 23): a sketch
maintained incrementally on a subscription's target missed a group a replicated UPDATE made
pass (``use`` with no maintenance, one row fewer than PostgreSQL). Such a table is never
maintained incrementally now; a state built before its subscription is invalid — by the
epoch ``CREATE``/``ALTER SUBSCRIPTION`` bump, and by the delta read's probe when the event
trigger is off.

These tests need ``wal_level = logical``: they run on a cluster of their own, with a publisher
and a subscriber database in it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

import pg_extensions
from imp_proxy.embedded import LocalPostgres
from sketches.manager import SketchManager, SketchSettings
from tests.sketches.test_manager_ivm import check, entry_of, wait_for

Conn = psycopg.Connection[Any]

QUERY = "SELECT g, count(*), sum(v) FROM t GROUP BY g HAVING sum(v) > 1000"
ROWS = ("INSERT INTO t SELECT i, i % 300, CASE WHEN i % 300 < 5 THEN 100 ELSE i % 7 END"
        " FROM generate_series(1, 6000) i")
"""300 groups of 20 rows; groups 0–4 sum to 2000, the others to at most 120."""


@dataclass
class Pair:
    pub: Conn
    sub: Conn
    pub_dsn: str


@pytest.fixture(scope="module")
def logical() -> Iterator[LocalPostgres]:
    cluster = LocalPostgres.throwaway_cluster(settings={
        "wal_level": "logical", "max_replication_slots": "4", "max_wal_senders": "4",
        "max_logical_replication_workers": "2", "max_connections": "40",
        "shared_buffers": "32MB"})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def pair(logical: LocalPostgres) -> Iterator[Pair]:
    """A publisher and a subscriber database, each with table ``t`` holding the same rows, the
    publication ``pb`` and its slot ``sl``; the subscriber has schema ``imp``. Whatever
    subscription a test creates is dropped afterwards."""
    with psycopg.connect(logical.dsn(), autocommit=True) as admin:
        for db in ("pub", "sub"):
            admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {db}")
    with psycopg.connect(logical.dsn("pub"), autocommit=True) as pub, \
            psycopg.connect(logical.dsn("sub"), autocommit=True) as sub:
        for c in (pub, sub):
            c.execute("CREATE TABLE t (id int PRIMARY KEY, g int, v int)")
            c.execute(ROWS)
            c.execute("ANALYZE t")
        pub.execute("CREATE PUBLICATION pb FOR TABLE t")
        pub.execute("SELECT pg_create_logical_replication_slot('sl', 'pgoutput')")
        pg_extensions.install(sub)
        try:
            yield Pair(pub, sub, logical.dsn("pub"))
        finally:
            if sub.execute("SELECT 1 FROM pg_subscription").fetchone():
                sub.execute("ALTER SUBSCRIPTION sb DISABLE")
                sub.execute("ALTER SUBSCRIPTION sb SET (slot_name = NONE)")
                sub.execute("DROP SUBSCRIPTION sb")
            pub.execute("SELECT pg_drop_replication_slot('sl')")


def subscribe(p: Pair) -> None:
    """Subscribes ``sub`` to ``pb`` without copying (both hold the same rows). The slot was
    made beforehand: in one cluster, CREATE SUBSCRIPTION cannot create its own."""
    p.sub.execute(f"CREATE SUBSCRIPTION sb CONNECTION '{p.pub_dsn}' PUBLICATION pb"
                  " WITH (create_slot = false, slot_name = 'sl', copy_data = false)")


def replicate_update(p: Pair) -> None:
    """Group 150 passes HAVING on the publisher; waits until the subscriber has it."""
    p.pub.execute("UPDATE t SET v = 1000 WHERE g = 150")
    wait_for(lambda: p.sub.execute("SELECT count(*) FROM t WHERE v = 1000").fetchone() == (20,),
             timeout=30)


def maintained(m: SketchManager, sub: Conn) -> int | None:
    """A sketch of QUERY on ``sub`` with its state built and maintained once (writes of
    other groups made directly on ``sub``); returns its id."""
    first = check(m, sub, QUERY, None)
    assert first.decision == "capture"
    wait_for(lambda: sub.execute("SELECT count(*) FROM imp.tracked_tables"
                                 " WHERE relid = 't'::regclass").fetchone() == (1,))
    for i in (1, 2):
        sub.execute("INSERT INTO t VALUES (%s, 299, 1)", (100000 + i,))
        p = check(m, sub, QUERY, None)
    entry = entry_of(m, p.sketch_id)
    assert entry["strategy"] == "lazy" and entry["maintenances"] == 1, entry
    return p.sketch_id


def test_a_subscribed_table_is_not_maintained_incrementally(pair: Pair) -> None:
    subscribe(pair)
    m = SketchManager(SketchSettings(fragments=50))
    try:
        first = check(m, pair.sub, QUERY, None)
        assert first.decision == "capture"
        assert entry_of(m, first.sketch_id)["strategy"] == "recapture"
        replicate_update(pair)
        after = check(m, pair.sub, QUERY, None)   # the oracle: same rows as PostgreSQL's
        assert after.decision == "capture"
        assert 150 in {r[0] for r in pair.sub.execute(QUERY).fetchall()}
    finally:
        m.close()


@pytest.mark.parametrize("guard", ["event trigger", "probe"])
def test_a_subscription_created_after_the_state_invalidates_it(pair: Pair, guard: str) -> None:
    """``probe``: with the event trigger off the epoch stays, and the delta read's probe
    (the table is a subscription's target now) catches it."""
    m = SketchManager(SketchSettings(fragments=50))
    try:
        sid = maintained(m, pair.sub)
        if guard == "probe":
            pair.sub.execute("ALTER EVENT TRIGGER imp_ddl_end DISABLE")
        try:
            subscribe(pair)
        finally:
            pair.sub.execute("ALTER EVENT TRIGGER imp_ddl_end ENABLE ALWAYS")
        replicate_update(pair)
        after = check(m, pair.sub, QUERY, None)
        assert after.decision == "capture" and after.sketch_id != sid
        assert entry_of(m, after.sketch_id)["strategy"] == "recapture"
    finally:
        m.close()


def test_a_subscription_gone_before_the_next_maintenance_still_invalidates(pair: Pair) -> None:
    """Subscribed, a write replicated, the subscription dropped: the probe sees nothing now;
    the epoch CREATE SUBSCRIPTION bumped does."""
    m = SketchManager(SketchSettings(fragments=50))
    try:
        sid = maintained(m, pair.sub)
        subscribe(pair)
        replicate_update(pair)
        pair.sub.execute("ALTER SUBSCRIPTION sb DISABLE")
        pair.sub.execute("ALTER SUBSCRIPTION sb SET (slot_name = NONE)")
        pair.sub.execute("DROP SUBSCRIPTION sb")
        after = check(m, pair.sub, QUERY, None)
        assert after.decision == "capture" and after.sketch_id != sid
        assert entry_of(m, after.sketch_id)["strategy"] == "lazy"   # no subscription now
    finally:
        m.close()
