"""Schema imp restored by pg_dump / pg_restore into another database — of the same cluster or of
a fresh one — next to the application's tables (pg_extensions/004_identity.sql). Its own xids,
snapshots and table oids belonged to the old database: the proxy's first contact discards them,
and every answer through the proxy is compared with PostgreSQL's own, with the sketch path in
use afterwards."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from imp_proxy.embedded import PG_BIN, LocalPostgres

from .conftest import LaunchProxy, scalar, stats, via_proxy, wait_until

HAVING = "SELECT g, sum(v) AS s FROM t GROUP BY g HAVING sum(v) > 5040000 ORDER BY g"
TOPK = "SELECT g, count(*) AS n, max(v) AS m FROM t GROUP BY g ORDER BY m DESC, g LIMIT 5"
QUERIES = [HAVING, TOPK]


def _load(dsn: str, extra: str = "", rows: int = 50_000) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"CREATE {extra} TABLE t (g int NOT NULL, v int NOT NULL)")
        c.execute(f"INSERT INTO t SELECT i % 1000, i FROM generate_series(1, {rows}) i")
        c.execute("CREATE INDEX ON t (g)")
        c.execute("ANALYZE t")


def _exact(proxied: str, direct: str) -> None:
    with psycopg.connect(proxied, autocommit=True) as pc, \
            psycopg.connect(direct, autocommit=True) as dc:
        for q in QUERIES:
            got = pc.execute(q.encode()).fetchall()
            want = dc.execute(q.encode()).fetchall()
            assert got == want, f"{q}: proxy {got[:6]} != direct {want[:6]}"


def _stat(dsn: str, key: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        return int(stats(c).get(key, "0"))


def _used(proxied: str, direct: str, limit: int = 8) -> int:
    """Rounds of exact answers until the proxy answered one through a sketch."""
    before = _stat(proxied, "proxy.used")
    for n in range(1, limit + 1):
        _exact(proxied, direct)
        if _stat(proxied, "proxy.used") > before:
            return n
    raise AssertionError(f"no sketch used in {limit} rounds")


def _write(direct: str, groups: tuple[int, ...]) -> None:
    with psycopg.connect(direct, autocommit=True) as c:
        c.execute("UPDATE t SET v = v + 90000 WHERE g = ANY(%s)", (list(groups),))
        c.execute("DELETE FROM t WHERE g = 999")
        c.execute("INSERT INTO t SELECT 4242, i FROM generate_series(1, 80) i")


def _own_xids(dsn: str) -> set[int]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return {int(r[0]) for r in c.execute(
            "SELECT xid::text::bigint FROM imp.own_xacts").fetchall()}


def _tracked_without_triggers(dsn: str) -> list[int]:
    """Rows of imp.tracked_tables naming no relation with the four audit triggers."""
    with psycopg.connect(dsn, autocommit=True) as c:
        return [int(r[0]) for r in c.execute(
            "SELECT t.relid::bigint FROM imp.tracked_tables t WHERE (SELECT count(*)"
            " FROM pg_trigger g WHERE g.tgrelid = t.relid AND g.tgname LIKE 'imp\\_audit\\_%')"
            " <> 4").fetchall()]


def _run(argv: list[str], stdin: str | None = None) -> str:
    """Runs a PostgreSQL client program; returns its stderr's ERROR lines."""
    res = subprocess.run(argv, input=stdin, capture_output=True, text=True)
    return "\n".join(ln for ln in res.stderr.splitlines() if "ERROR" in ln)


def _dump_into(source: str, target: str, how: str, *select: str, strict: bool = True) -> None:
    """pg_dump of ``source`` (``select``: -t / -n options) restored into ``target``;
    ``strict``: without an error."""
    if how == "dump|psql":
        dump = subprocess.run([str(PG_BIN / "pg_dump"), *select, "-d", source],
                              capture_output=True, text=True)
        assert dump.returncode == 0, dump.stderr
        errors = _run([str(PG_BIN / "psql"), "-q", "-d", target], dump.stdout)
    else:
        f = Path(f"/tmp/imp_backup_restore_{os.getpid()}.dump")
        assert not _run([str(PG_BIN / "pg_dump"), "-Fc", *select, "-f", str(f), "-d", source])
        try:
            errors = _run([str(PG_BIN / "pg_restore"), "-d", target, str(f)])
        finally:
            f.unlink()
    assert not errors or not strict, errors


def _burn_until(dsn: str, target: int) -> None:
    """Aborted transactions until the next xid handed out is ``target``."""
    with psycopg.connect(dsn) as c:
        while True:
            row = c.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
            c.rollback()
            assert row is not None
            if int(row[0]) >= target - 1:
                return


def _next_xid(dsn: str) -> int:
    return int(scalar(dsn, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"))


@pytest.fixture
def other_cluster() -> Iterator[LocalPostgres]:
    """A second, fresh cluster (its xid and oid counters start low), stopped afterwards."""
    pg = LocalPostgres.throwaway_cluster()
    try:   # the start inside: an interrupted start leaves no cluster running either
        pg.start()
        yield pg
    finally:
        argv = [str(PG_BIN / "pg_ctl"), "stop", "-D", str(pg.datadir), "-m", "fast", "-w"]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        _run(argv)
        pg.destroy()


@pytest.mark.parametrize(("how", "serving"), [("dump|psql", "the same proxy"),
                                              ("custom+pg_restore", "the same proxy"),
                                              ("custom+pg_restore", "a proxy without persistence")])
def test_restore_into_another_database_of_the_cluster(launch: LaunchProxy, fresh_db: Any,
                                                      how: str, serving: str) -> None:
    """``serving``: the proxy that serves the restored database (without persistence the
    claim of schema imp happens on the prepare's other path, which must also leave it to the
    background thread when the wrapping holds the table)."""
    p = launch()
    a = fresh_db()
    _load(a)
    pa = via_proxy(a, p.port)
    _used(pa, a)
    _write(a, (7,))
    _used(pa, a)
    wait_until(lambda: bool(scalar(a, "SELECT count(*) FROM imp.tracked_tables")), timeout=20)
    _write(a, (3, 4))
    _used(pa, a)
    own_a = _own_xids(a)
    assert own_a

    b = fresh_db()
    _dump_into(a, b, how)
    pb = via_proxy(b, (p if serving == "the same proxy"
                       else launch("--library-setting", "persist=false")).port)
    _exact(pb, b)
    # the proxy's first query claimed schema imp for b, or had its background thread claim it
    # between queries (the claim drops audit triggers, which waits for the ACCESS SHARE the
    # query's wrapping holds): a's state is gone, and nothing of it was read before
    assert wait_until(lambda: not own_a & _own_xids(b), timeout=20)
    assert _tracked_without_triggers(b) == []
    assert int(scalar(b, "SELECT count(*) FROM imp.sketches WHERE relations IS NOT NULL"
                         " AND NOT ('t'::regclass::oid::bigint = ANY(relations))")) == 0
    _write(b, (5,))   # writes work: the restored audit triggers are gone (or rebuilt)
    _used(pb, b)
    wait_until(lambda: bool(scalar(b, "SELECT count(*) FROM imp.tracked_tables"
                                      " WHERE relid = 't'::regclass")), timeout=20)
    _write(b, (6, 7))
    _used(pb, b)
    assert _tracked_without_triggers(b) == []
    # the original is untouched and keeps working
    _write(a, (8,))
    _used(pa, a)


def _sketched_then_empty_b(launch: LaunchProxy, a: str, other_cluster: LocalPostgres,
                           args: list[str]) -> str:
    """Moves A's xid counter well beyond a fresh cluster's, sketches and writes through a
    proxy (``args``) on A, and creates database ``app`` in ``other_cluster``: its DSN."""
    _burn_until(a, _next_xid(a) + 3000)
    pa = via_proxy(a, launch(*args).port)
    for gs in ((7,), (8,), (9,)):
        _used(pa, a)
        _write(a, gs)
    _used(pa, a)
    with psycopg.connect(other_cluster.dsn(), autocommit=True) as c:
        c.execute("CREATE DATABASE app")
    return other_cluster.dsn("app")


@pytest.mark.parametrize("strategy", ["recapture", "lazy-unlogged"])
def test_restore_into_a_fresh_cluster_reuses_no_own_xid(launch: LaunchProxy, fresh_db: Any,
                                                        other_cluster: LocalPostgres,
                                                        strategy: str) -> None:
    """Cluster A (xids high) -> pg_dump -> fresh cluster B (xids low). B later hands the xids
    of A's own transactions to user transactions: a write under one must not go unseen."""
    a = fresh_db()
    _load(a, extra="UNLOGGED" if strategy == "lazy-unlogged" else "")
    args = ["--library-setting", "strategy=recapture"] if strategy == "recapture" else []
    b = _sketched_then_empty_b(launch, a, other_cluster, args)
    _dump_into(a, b, "dump|psql")
    nxt = _next_xid(b)
    future = sorted(x for x in _own_xids(b) if x > nxt + 50)
    assert future, "no restored own xid ahead of B's counter"

    pb = via_proxy(b, launch(*args, upstream=other_cluster.dsn()).port)
    _used(pb, b)
    assert not set(future) & _own_xids(b)
    # a user write under the xid of one of A's own transactions
    _burn_until(b, future[0])
    with psycopg.connect(b) as c:
        c.execute("UPDATE t SET v = v + 900000 WHERE g = 5")
        row = c.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
        c.commit()
    assert row is not None and int(row[0]) == future[0]
    _exact(pb, b)
    _used(pb, b)
    _write(b, (10, 11))
    _used(pb, b)


def test_restore_schema_by_schema_into_a_fresh_cluster_same_oid(
        launch: LaunchProxy, fresh_db: Any, other_cluster: LocalPostgres) -> None:
    """The application's schema first, then schema imp, into a fresh cluster where t gets the
    oid it had in A: A's sketches and states, versioned in A's xids, named B's t."""
    a = fresh_db()
    with psycopg.connect(a, autocommit=True) as c:
        for i in range(10):
            c.execute(f"CREATE TABLE pad{i} (x int)")
            c.execute(f"DROP TABLE pad{i}")
    _load(a)
    b = _sketched_then_empty_b(launch, a, other_cluster, [])
    target = int(scalar(a, "SELECT 't'::regclass::oid::int"))
    with psycopg.connect(b, autocommit=True) as c:   # B's next oid: t's in A
        while True:
            row = c.execute("SELECT lo_create(0)::int").fetchone()
            assert row is not None
            c.execute("SELECT lo_unlink(%s)", (row[0],))
            if int(row[0]) >= target - 1:
                break
    # t's audit triggers fail (their functions are in schema imp, restored next)
    _dump_into(a, b, "dump|psql", "-t", "public.t", strict=False)
    _dump_into(a, b, "dump|psql", "-n", "imp")
    a_next = _next_xid(a)
    assert int(scalar(b, "SELECT 't'::regclass::oid::int")) == target

    pb = via_proxy(b, launch(upstream=other_cluster.dsn()).port)
    _exact(pb, b)
    with psycopg.connect(b, autocommit=True) as c:
        c.execute("UPDATE t SET v = v + 900000 WHERE g = 5")
    _exact(pb, b)
    _write(b, (10, 11))
    _used(pb, b)
    # past A's xids: B's transactions now carry the xids A's versions were taken in
    _burn_until(b, a_next + 5)
    for g in (20, 21):
        with psycopg.connect(b, autocommit=True) as c:
            c.execute("UPDATE t SET v = v + 900000 WHERE g = %s", (g,))
        _exact(pb, b)
    _used(pb, b)
    assert _tracked_without_triggers(b) == []


def _dbname(dsn: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])


def _alone(admin: str, dbname: str, statement: str) -> None:
    """Runs ``statement`` on ``admin`` once no session is connected to ``dbname`` (the
    proxy's are ended first: CREATE DATABASE … TEMPLATE and RENAME refuse while any is)."""
    for _ in range(100):
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                      " WHERE datname = %s AND pid <> pg_backend_pid()", (dbname,))
            try:
                c.execute(statement.encode())
                return
            except psycopg.errors.ObjectInUse:
                pass
    raise AssertionError(f"{dbname} stayed in use: {statement}")


def _served_and_tracked(proxied: str, direct: str) -> None:
    """Sketches used, a write, used again, and the table tracked (maintained from now on)."""
    _used(proxied, direct)
    _write(direct, (7,))
    _used(proxied, direct)
    assert wait_until(lambda: bool(scalar(direct, "SELECT count(*) FROM imp.tracked_tables")),
                      20)


def _exact_rounds(proxied: str, direct: str, rounds: int = 4) -> None:
    """Exact answers in every round (after a reconnection the first ones may pass through)."""
    for _ in range(rounds):
        _exact(proxied, direct)


def test_a_database_made_anew_from_a_copy_of_itself_is_not_answered_from_memory(
        launch: LaunchProxy, fresh_db: Any, admin_dsn: str) -> None:
    """d served and tracked; snap = a template copy of d; more writes to d; then d dropped and
    created anew from snap, all directly on PostgreSQL: same name, same table oids and
    epochs, but without the writes made after the copy."""
    a, snap = fresh_db(), fresh_db()
    d, s = _dbname(a), _dbname(snap)
    _load(a)
    pa = via_proxy(a, launch().port)
    _served_and_tracked(pa, a)
    _alone(admin_dsn, s, f'DROP DATABASE "{s}"')
    _alone(admin_dsn, d, f'CREATE DATABASE "{s}" TEMPLATE "{d}"')
    _write(a, (3, 4))
    _used(pa, a)
    _alone(admin_dsn, d, f'DROP DATABASE "{d}"')
    _alone(admin_dsn, s, f'CREATE DATABASE "{d}" TEMPLATE "{s}"')
    _exact_rounds(pa, a)
    _write(a, (5,))
    _used(pa, a)
    assert _stat(pa, "databases_replaced") >= 1


def test_two_copies_of_a_database_that_swap_names_are_not_answered_from_memory(
        launch: LaunchProxy, fresh_db: Any, admin_dsn: str) -> None:
    """d and its template copy d2, both served by one proxy; t truncated and filled anew in d
    (both copies' epoch sequences hand out the same epoch); then d and d2 swap names."""
    a, b, tmp = fresh_db(), fresh_db(), fresh_db()
    d, d2, t = _dbname(a), _dbname(b), _dbname(tmp)
    _load(a)
    p = launch()
    pa, pb = via_proxy(a, p.port), via_proxy(b, p.port)
    _served_and_tracked(pa, a)
    _alone(admin_dsn, d2, f'DROP DATABASE "{d2}"')
    _alone(admin_dsn, d, f'CREATE DATABASE "{d2}" TEMPLATE "{d}"')
    _used(pb, b)
    _write(b, (8,))
    _used(pb, b)
    assert wait_until(lambda: bool(scalar(b, "SELECT count(*) FROM imp.tracked_tables")), 20)
    with psycopg.connect(a) as c:
        c.execute("TRUNCATE t")
        c.execute("INSERT INTO t SELECT i % 1000, i + 7 FROM generate_series(1, 50000) i")
        c.execute("DELETE FROM t WHERE g IN (0, 995)")
        c.commit()
    _used(pa, a)
    epochs = "SELECT epoch FROM imp.tracked_tables WHERE relid = 't'::regclass"
    assert scalar(a, epochs) == scalar(b, epochs)   # what made the swap go unseen
    _alone(admin_dsn, t, f'DROP DATABASE "{t}"')
    _alone(admin_dsn, d, f'ALTER DATABASE "{d}" RENAME TO "{t}"')
    _alone(admin_dsn, d2, f'ALTER DATABASE "{d2}" RENAME TO "{d}"')
    _alone(admin_dsn, t, f'ALTER DATABASE "{t}" RENAME TO "{d2}"')
    _exact_rounds(pa, a)
    _exact_rounds(pb, b)
    _write(a, (5,))
    _write(b, (6,))
    _used(pa, a)
    _used(pb, b)


@pytest.mark.parametrize("proxy", ["the same proxy", "a restarted proxy"])
def test_schema_imp_restored_from_an_older_dump_of_the_same_database(
        launch: LaunchProxy, fresh_db: Any, proxy: str) -> None:
    """Last night's schema imp over today's tables (``pg_restore --clean -n imp``): the
    restore's drop of each audit table took its table's audit triggers, and the restored
    tracking rows, audit tables and sketches are from before today's writes."""
    a = fresh_db()
    _load(a)
    args = ["--library-setting", "state_interval=0.5"]
    p = launch(*args)
    pa = via_proxy(a, p.port)
    _used(pa, a)
    _write(a, (7,))
    _used(pa, a)
    assert wait_until(lambda: bool(scalar(a, "SELECT count(*) FROM imp.ivm_state")), 20)
    f = Path(f"/tmp/imp_backup_restore_old_{os.getpid()}.dump")
    assert not _run([str(PG_BIN / "pg_dump"), "-Fc", "-f", str(f), "-d", a])
    try:
        _write(a, (3, 4))
        _used(pa, a)
        # errors: the DDL guard's functions, which its event triggers keep, are not dropped
        _run([str(PG_BIN / "pg_restore"), "-d", a, "-n", "imp", "--clean", str(f)])
    finally:
        f.unlink()
    assert _tracked_without_triggers(a) != []   # the state the restore leaves
    if proxy == "a restarted proxy":
        p.stop()
        pa = via_proxy(a, launch(*args).port)
    _exact_rounds(pa, a)
    _write(a, (5,))
    _exact_rounds(pa, a)
    _used(pa, a)
    assert _tracked_without_triggers(a) == []
