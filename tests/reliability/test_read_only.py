"""A read-only upstream: a hot standby (streaming replication, made by ``pg_basebackup``) or a
database whose transactions default to read only. Capture and maintenance write schema
``imp``, so every query passes through, exact, with one WARNING in the proxy's log instead
of one per query; a standby promoted under the proxy is sketched again."""

from __future__ import annotations

import os
import pwd
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from imp_proxy.embedded import PG_BIN, LocalPostgres

from .conftest import (
    HAVING_T,
    TOPK_T,
    LaunchProxy,
    ProxyProcess,
    load_t,
    move_t,
    scalar,
    via_proxy,
    wait_until,
)

READ_ONLY = "the server is read-only"


def _as_server_user(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@pytest.fixture
def standby() -> Iterator[tuple[LocalPostgres, LocalPostgres]]:
    """(primary, hot standby streaming from it), both stopped and removed afterwards."""
    primary = LocalPostgres.throwaway_cluster()
    replica: LocalPostgres | None = None
    try:
        primary.start()
        base = Path(tempfile.mkdtemp(prefix="imp-pg-standby-", dir="/tmp"))
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(base, pw.pw_uid, pw.pw_gid)
        done = subprocess.run(_as_server_user(
            [str(PG_BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port),
             "-U", "postgres", "-D", str(base / "data"), "-R", "-X", "stream", "-c", "fast"]),
            capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        replica = LocalPostgres(datadir=base / "data", throwaway=True)
        replica.start()
        yield primary, replica
    finally:
        if replica is not None:
            replica.destroy()
        primary.destroy()


def _caught_up(primary: str, replica: str) -> None:
    """Waits until the replica replayed every WAL record the primary has inserted. The insert
    position, not ``pg_current_wal_lsn()`` (written): with the throwaway clusters'
    ``synchronous_commit = off`` a commit can still sit in the WAL buffers, so a replica
    "caught up" to the written position could miss it (found in CI: a query through the
    proxy saw the row before an UPDATE, the direct one right after it the row after)."""
    lsn = scalar(primary, "SELECT pg_current_wal_insert_lsn()::text")
    assert wait_until(lambda: bool(scalar(
        replica, "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,))), timeout=30)


def _decision(proxied: psycopg.Connection[Any], q: str) -> dict[Any, Any]:
    return dict(proxied.execute(f"IMP EXPLAIN {q}").fetchall())


def _exact_and_refused(proxied: str, direct: str, rounds: int) -> None:
    with psycopg.connect(proxied, autocommit=True) as pc, \
            psycopg.connect(direct, autocommit=True) as dc:
        for _ in range(rounds):
            for q in (HAVING_T, TOPK_T):
                assert pc.execute(q).fetchall() == dc.execute(q).fetchall(), q
        plan = _decision(pc, HAVING_T)
        assert plan["decision"] == "passthrough"
        assert READ_ONLY in str(plan["reason"]), plan


def _warned_once(proxy: ProxyProcess) -> None:
    """Found by a helper's search (session 26): a WARNING per sketchable query, for ever (each
    query's prepare failed writing schema imp)."""
    log = proxy.log_text()
    assert log.count(READ_ONLY) == 1, log[-3000:]
    assert "sketch prepare failed" not in log, log[-3000:]


def test_a_read_only_database_passes_through_with_one_warning(fresh_db: Any,
                                                              launch: LaunchProxy) -> None:
    direct = str(fresh_db())
    load_t(direct)
    name = psycopg.conninfo.conninfo_to_dict(direct)["dbname"]
    with psycopg.connect(direct, autocommit=True) as c:
        c.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    proxy = launch(upstream=direct)
    _exact_and_refused(via_proxy(direct, proxy.port), direct, rounds=10)
    _warned_once(proxy)


@pytest.mark.slow
def test_a_hot_standby_passes_through_and_is_sketched_once_promoted(
        standby: tuple[LocalPostgres, LocalPostgres], launch: LaunchProxy) -> None:
    primary, replica = standby
    load_t(primary.dsn())
    _caught_up(primary.dsn(), replica.dsn())
    proxy = launch(upstream=replica.dsn())
    proxied = via_proxy(replica.dsn(), proxy.port)
    for n in range(3):
        _exact_and_refused(proxied, replica.dsn(), rounds=4)
        move_t(primary.dsn(), n)
        _caught_up(primary.dsn(), replica.dsn())
    _warned_once(proxy)
    done = subprocess.run(_as_server_user([str(PG_BIN / "pg_ctl"), "promote", "-w", "-D",
                                           str(replica.datadir)]), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    move_t(replica.dsn(), 7)
    with psycopg.connect(proxied, autocommit=True) as pc, \
            psycopg.connect(replica.dsn(), autocommit=True) as dc:

        def sketched() -> bool:
            for q in (HAVING_T, TOPK_T):
                assert pc.execute(q).fetchall() == dc.execute(q).fetchall(), q
            return str(_decision(pc, HAVING_T)["decision"]) in ("use", "capture")

        assert wait_until(sketched, timeout=60, interval=1.0)
        for n in range(8, 11):   # maintained on the promoted server
            move_t(replica.dsn(), n)
            for q in (HAVING_T, TOPK_T):
                assert pc.execute(q).fetchall() == dc.execute(q).fetchall(), q
