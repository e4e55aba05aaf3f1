"""imp.identity and imp.claim_identity() of pg_extensions/004_identity.sql: schema imp restored
into another database discards the state that only meant something in the old one."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pg_extensions
from sketches import catalog

Conn = psycopg.Connection[Any]

AUDIT_TRIGGERS = ("imp_audit_del", "imp_audit_ins", "imp_audit_trunc", "imp_audit_upd")


def _identity(conn: Conn) -> tuple[int, int]:
    row = conn.execute("SELECT (SELECT system_identifier FROM pg_control_system()),"
                       " (SELECT oid::bigint FROM pg_database"
                       "  WHERE datname = current_database())").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _recorded(conn: Conn) -> list[tuple[int, int]]:
    return [(int(r[0]), int(r[1])) for r in conn.execute(
        "SELECT system_identifier, database_oid::bigint FROM imp.identity").fetchall()]


def _claim(conn: Conn, warnings: list[str] | None = None) -> bool:
    def note(diag: psycopg.errors.Diagnostic) -> None:
        if warnings is not None and diag.severity == "WARNING":
            warnings.append(str(diag.message_primary))
    conn.add_notice_handler(note)
    try:
        row = conn.execute("SELECT imp.claim_identity()").fetchone()
    finally:
        conn.remove_notice_handler(note)
    assert row is not None
    return bool(row[0])


def _count(conn: Conn, query: str) -> int:
    row = conn.execute(query.encode()).fetchone()
    assert row is not None
    return int(row[0])


def _audit_triggers(conn: Conn, table: str) -> list[str]:
    return [str(r[0]) for r in conn.execute(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND tgname LIKE 'imp%%'"
        " ORDER BY tgname", (table,)).fetchall()]


@pytest.fixture
def fresh(conn: Conn) -> Conn:
    conn.execute("DROP SCHEMA IF EXISTS imp CASCADE")
    for t in ("id_a", "id_b", "id_c", "id_p"):
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(t)))
    pg_extensions.install(conn)
    return conn


def test_a_fresh_install_records_this_database(fresh: Conn) -> None:
    assert _recorded(fresh) == [_identity(fresh)]
    assert not _claim(fresh)
    assert _recorded(fresh) == [_identity(fresh)]


def test_a_matching_claim_reads_only(fresh: Conn) -> None:
    """The proxy claims inside a query's transaction: a write would give it an xid, and its
    commit a new snapshot for every client."""
    fresh.execute("BEGIN")
    try:
        assert not _claim(fresh)
        row = fresh.execute("SELECT pg_current_xact_id_if_assigned()").fetchone()
        assert row == (None,)
    finally:
        fresh.execute("ROLLBACK")


def test_an_older_schema_without_identity_is_claimed_without_judging(fresh: Conn) -> None:
    fresh.execute("CREATE TABLE id_a (g int, v int)")
    fresh.execute("SELECT imp.track_table('id_a')")
    fresh.execute("DELETE FROM imp.identity")
    assert not _claim(fresh)
    assert _recorded(fresh) == [_identity(fresh)]
    assert _count(fresh, "SELECT count(*) FROM imp.tracked_tables") == 1


def test_catalog_claim_identity_without_schema_imp(fresh: Conn) -> None:
    fresh.execute("DROP SCHEMA imp CASCADE")
    assert not catalog.claim_identity(fresh, installed=False)
    assert not catalog.is_installed(fresh)
    assert catalog.ensure_installed(fresh)
    assert not catalog.claim_identity(fresh)


def _populate(conn: Conn) -> None:
    """State of every kind: tracked tables (one partitioned), audit rows, a tracked_tables row
    whose relid names a table without triggers, audit triggers with no tracked_tables row (as
    a restore leaves them), a sketch with fragments, a partition, a persisted state, own
    transactions and a GC watermark."""
    conn.execute("CREATE TABLE id_a (g int, v int)")
    conn.execute("CREATE TABLE id_b (g int, v int)")
    conn.execute("CREATE TABLE id_c (g int, v int)")
    conn.execute("CREATE TABLE id_p (g int, v int) PARTITION BY RANGE (g)")
    conn.execute("CREATE TABLE id_p1 PARTITION OF id_p FOR VALUES FROM (0) TO (100)")
    for t in ("id_a", "id_b", "id_p"):
        conn.execute("SELECT imp.track_table(%s::regclass)", (t,))
        conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 1), (2, 2)").format(sql.Identifier(t)))
    # id_b: triggers and audit table, but no row (a restored row named the old oid)
    conn.execute("DELETE FROM imp.tracked_tables WHERE relid = 'id_b'::regclass")
    # a row naming id_c, which has no triggers (the old database's oid of another table)
    conn.execute("INSERT INTO imp.tracked_tables (relid, audit_table, columns)"
                 " VALUES ('id_c'::regclass, 'imp.tracked_tables', '{g,v}')")
    conn.execute("INSERT INTO imp.range_partitions (schema_name, table_name, column_name,"
                 " type_name, bounds, bounds_literal) VALUES ('public', 'id_a', 'g', 'int4',"
                 " '{0,10}', '{0,10}')")
    conn.execute("INSERT INTO imp.sketches (template, query_text, tables, attributes,"
                 " partition_ids, version) SELECT 'x', 'SELECT 1', '{public.id_a}', '{g}',"
                 " ARRAY[id], pg_current_snapshot() FROM imp.range_partitions")
    conn.execute("INSERT INTO imp.sketch_fragments SELECT s.id, 0, s.partition_ids[1], '{1}'"
                 " FROM imp.sketches s")
    conn.execute("INSERT INTO imp.ivm_state (sketch_key, version, epochs, state)"
                 " SELECT id::text, version, '{}', '{}' FROM imp.sketches")
    conn.execute("INSERT INTO imp.own_xacts (xid) VALUES ('1000'), ('1001')")
    conn.execute("INSERT INTO imp.collected VALUES ('id_a'::regclass, pg_current_snapshot())")


STATE = {
    "sketches": "SELECT count(*) FROM imp.sketches",
    "fragments": "SELECT count(*) FROM imp.sketch_fragments",
    "partitions": "SELECT count(*) FROM imp.range_partitions",
    "states": "SELECT count(*) FROM imp.ivm_state",
    "own": "SELECT count(*) FROM imp.own_xacts",
    "collected": "SELECT count(*) FROM imp.collected",
    "tracked": "SELECT count(*) FROM imp.tracked_tables",
    "audit tables": "SELECT count(*) FROM pg_class WHERE relnamespace = 'imp'::regnamespace"
                    " AND relname LIKE 'delta\\_%'",
    "audit triggers": "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'imp\\_audit\\_%'",
}


def test_another_databases_state_is_discarded(fresh: Conn) -> None:
    _populate(fresh)
    assert all(_count(fresh, q) > 0 for q in STATE.values())
    assert not _claim(fresh)   # this database's own: kept
    assert all(_count(fresh, q) > 0 for q in STATE.values())

    fresh.execute("UPDATE imp.identity SET database_oid = 1")   # as if restored from another
    warnings: list[str] = []
    assert _claim(fresh, warnings)
    assert {name: _count(fresh, q) for name, q in STATE.items()} == dict.fromkeys(STATE, 0)
    assert _recorded(fresh) == [_identity(fresh)]
    assert len(warnings) == 1 and "another database" in warnings[0], warnings
    for t in ("id_a", "id_b", "id_c", "id_p", "id_p1"):
        assert _audit_triggers(fresh, t) == []
        # writes work (no trigger left writing into an audit table that is gone)
        fresh.execute(sql.SQL("INSERT INTO {} VALUES (3, 3)").format(sql.Identifier(t)))
        fresh.execute(sql.SQL("UPDATE {} SET v = v + 1").format(sql.Identifier(t)))
        fresh.execute(sql.SQL("DELETE FROM {} WHERE g = 1").format(sql.Identifier(t)))
    fresh.execute("TRUNCATE id_a")
    assert not _claim(fresh)

    # tracking starts afresh: id_c is no longer taken as tracked without its triggers
    fresh.execute("SELECT imp.track_table('id_c')")
    assert _audit_triggers(fresh, "id_c") == sorted(AUDIT_TRIGGERS)
    fresh.execute("INSERT INTO id_c VALUES (9, 9)")
    assert _count(fresh, "SELECT count(*) FROM imp.delta_" + str(_count(
        fresh, "SELECT 'id_c'::regclass::oid::bigint"))) == 1


def test_a_discard_waits_for_a_table_lock_at_most_two_seconds(fresh: Conn,
                                                               db_dsn: str) -> None:
    """The proxy's background thread claims in a statement of its own, and its connections no
    longer set a session ``lock_timeout`` (session 26: behind a transaction pooler it stayed on
    the pooled server connections); found by a regression search: the claim's DROP TRIGGER
    would then wait behind a client's open transaction as long as that lasted. Here the
    holder keeps its lock 8 s; the claim gives up first (55P03) and keeps everything."""
    _populate(fresh)
    fresh.execute("UPDATE imp.identity SET database_oid = 1")
    with psycopg.connect(db_dsn, autocommit=True) as holder:
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE id_a IN ACCESS SHARE MODE")
        with psycopg.connect(db_dsn, autocommit=True) as claimer:
            releaser = threading.Timer(8.0, lambda: holder.execute("COMMIT"))
            releaser.start()
            try:
                with pytest.raises(psycopg.errors.LockNotAvailable):
                    claimer.execute("SELECT imp.claim_identity()")
            finally:
                releaser.join()
    assert _recorded(fresh) != [_identity(fresh)]   # rolled back: claimed again later
    assert _claim(fresh)


def test_tracking_by_hand_in_a_restored_database_claims_it_first(fresh: Conn) -> None:
    """``imp.track_table`` run by hand before any proxy connected: the restored row naming
    id_c (an oid of the old database) is not believed; id_c gets its triggers."""
    _populate(fresh)
    fresh.execute("UPDATE imp.identity SET database_oid = 1")
    fresh.execute("SELECT imp.track_table('id_c')")
    assert _recorded(fresh) == [_identity(fresh)]
    assert _count(fresh, STATE["sketches"]) == 0 and _count(fresh, STATE["own"]) == 0
    assert _audit_triggers(fresh, "id_c") == sorted(AUDIT_TRIGGERS)


def test_another_clusters_state_is_discarded(fresh: Conn) -> None:
    _populate(fresh)
    fresh.execute("UPDATE imp.identity SET system_identifier = system_identifier + 1")
    assert _claim(fresh)
    assert _count(fresh, STATE["own"]) == 0 and _count(fresh, STATE["tracked"]) == 0
    assert _recorded(fresh) == [_identity(fresh)]


def test_a_discard_rolls_back_with_its_transaction(fresh: Conn) -> None:
    _populate(fresh)
    fresh.execute("UPDATE imp.identity SET database_oid = 1")
    fresh.execute("BEGIN")
    assert _claim(fresh)
    fresh.execute("ROLLBACK")
    assert _count(fresh, STATE["sketches"]) == 1 and _count(fresh, STATE["tracked"]) == 3
    assert _recorded(fresh)[0][1] == 1
    assert _claim(fresh)


def test_a_reinstall_over_a_foreign_identity_discards_it(fresh: Conn) -> None:
    """A migration re-applied (its checksum changed) claims too: it runs the claim last."""
    _populate(fresh)
    fresh.execute("UPDATE imp.identity SET database_oid = 1")
    fresh.execute("UPDATE imp.schema_version SET checksum = 'old' WHERE version = 4")
    assert pg_extensions.install(fresh) == ["004_identity.sql"]
    assert _count(fresh, STATE["own"]) == 0 and _count(fresh, STATE["audit triggers"]) == 0
    assert _recorded(fresh) == [_identity(fresh)]


def test_two_first_claims_at_once_in_repeatable_read(fresh: Conn, db_dsn: str) -> None:
    """A query's prepare claims in its REPEATABLE READ transaction while the maintenance
    thread claims on its own connection: the one whose snapshot predates the other's insert
    of the identity failed with 40001 on its own INSERT (found: a fresh-clone CI run of the
    manager's hypothesis workload). It now finds nothing to judge, as the other did, and its
    transaction goes on."""
    fresh.execute("DELETE FROM imp.identity")
    with psycopg.connect(db_dsn, autocommit=True) as other:
        fresh.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        try:
            assert _recorded(fresh) == []   # the snapshot, taken before the other's claim
            assert not _claim(other)
            assert not _claim(fresh)
            assert _count(fresh, "SELECT count(*) FROM imp.identity") == 0
        finally:
            fresh.execute("COMMIT")
    assert _recorded(fresh) == [_identity(fresh)]
