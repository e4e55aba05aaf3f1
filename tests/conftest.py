"""Shared fixtures: one throwaway PostgreSQL 15 cluster per test session (or IMP_TEST_DSN),
and a fresh database per test module so tests never see each other's tables."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from imp_proxy.embedded import EmbeddedPostgresError, LocalPostgres


def server_pids(marker: str) -> list[int]:
    """PIDs of the PostgreSQL processes (a postmaster, its children, or ``runuser`` starting
    one) whose command line contains ``marker`` (a data directory, ``port=N``); never an
    ``imp-proxy``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd and "postgres" in cmd and "imp-proxy" not in cmd:
            pids.append(int(proc.name))
    return pids


@pytest.fixture(scope="session")
def pg_server() -> Iterator[LocalPostgres | None]:
    """The session's cluster; None when IMP_TEST_DSN points at an existing server."""
    if os.environ.get("IMP_TEST_DSN"):
        yield None
        return
    cluster = LocalPostgres.throwaway_cluster()
    try:   # the start inside: an interrupted start leaves no cluster running either
        try:
            cluster.start()
        except EmbeddedPostgresError as exc:
            pytest.exit(f"cannot start the throwaway PostgreSQL 15: {exc}", returncode=3)
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture(scope="session")
def admin_dsn(pg_server: LocalPostgres | None) -> str:
    """Superuser DSN of the maintenance database."""
    dsn = os.environ.get("IMP_TEST_DSN") or (pg_server.dsn() if pg_server else "")
    try:
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        pytest.exit(f"PostgreSQL at {dsn!r} is unreachable: {exc}", returncode=3)
    return dsn


def _dsn_for_db(admin_dsn: str, dbname: str) -> str:
    return psycopg.conninfo.make_conninfo(admin_dsn, dbname=dbname)


def _create_db(admin_dsn: str) -> str:
    """A new empty database's name."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name


def _drop_dbs(admin_dsn: str, names: list[str]) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def db_dsn(admin_dsn: str) -> Iterator[str]:
    """A fresh database for the test module, dropped afterwards."""
    name = _create_db(admin_dsn)
    try:
        yield _dsn_for_db(admin_dsn, name)
    finally:
        _drop_dbs(admin_dsn, [name])


@pytest.fixture(scope="module")
def fresh_db(admin_dsn: str) -> Iterator[Callable[[], str]]:
    """Factory for extra empty databases (dropped at module end); returns their DSNs."""
    names: list[str] = []

    def make() -> str:
        names.append(_create_db(admin_dsn))
        return _dsn_for_db(admin_dsn, names[-1])

    try:
        yield make
    finally:
        _drop_dbs(admin_dsn, names)


@pytest.fixture
def conn(db_dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """An autocommit connection to the module's database."""
    with psycopg.connect(db_dsn, autocommit=True) as c:
        yield c


@pytest.fixture(scope="session", autouse=True)
def _proxy_logs_in_pytest_temp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Logs of the proxies the tests start go under pytest's temporary directory (which keeps
    the last three runs) instead of piling up in /tmp."""
    old = os.environ.get("IMP_PROXY_LOG_DIR")
    os.environ["IMP_PROXY_LOG_DIR"] = str(tmp_path_factory.mktemp("proxy-logs"))
    yield
    if old is None:
        os.environ.pop("IMP_PROXY_LOG_DIR", None)
    else:
        os.environ["IMP_PROXY_LOG_DIR"] = old


@pytest.fixture(autouse=True)
def _close_sketch_managers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Stops the background thread of every SketchManager a test creates: it would otherwise
    outlive the test's database (and the session's PostgreSQL) and log failed rounds."""
    from sketches.manager import SketchManager

    created: list[SketchManager] = []
    init = SketchManager.__init__

    def tracked(self: SketchManager, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        created.append(self)

    monkeypatch.setattr(SketchManager, "__init__", tracked)
    yield
    for m in created:
        m.close()
