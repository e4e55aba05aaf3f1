from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from imp_proxy import embedded
from imp_proxy.embedded import LocalPostgres
from tests.conftest import server_pids


def test_throwaway_cluster_answers(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    row = conn.execute("SHOW server_version_num").fetchone()
    assert row is not None and int(str(row[0])) // 10000 == 15


def test_a_start_interrupted_inside_popen_leaves_no_server(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A signal that lands in ``subprocess.Popen`` after the fork leaves the object without
    its process (found as an occasional cluster left running by a SIGINT during a serve's
    start): the postmaster it spawned is found through ``postmaster.pid`` and stopped."""
    real = subprocess.Popen

    def interrupted(argv: list[str], *args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = real(argv, *args, **kwargs)
        if any(str(a).endswith("/bin/postgres") for a in argv):   # not initdb, pg_isready
            raise KeyboardInterrupt   # as a SIGINT right after the fork would
        return proc

    monkeypatch.setattr(embedded.subprocess, "Popen", interrupted)
    base = Path(tempfile.mkdtemp(prefix="imp-interrupted-", dir="/tmp"))
    shutil.chown(base, "postgres")
    pg = LocalPostgres(datadir=base / "data", throwaway=False)   # kept, as serve's is
    try:
        with pytest.raises(KeyboardInterrupt):
            pg.start()
        pg.stop()   # what the serve's finally does
        time.sleep(2)   # a server left behind has started by now
        assert not server_pids(str(pg.datadir))
    finally:
        for pid in server_pids(str(pg.datadir)):   # the old code's leftover, by PID
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGQUIT)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_a_cluster_under_a_deep_data_directory_starts_and_answers_on_its_socket() -> None:
    """A socket next to a data directory more than about 80 characters deep would exceed the
    kernel's 107-byte limit (PostgreSQL refused to start: found in session 23); it goes to a
    directory of its own under /tmp instead, kept for the same data directory."""
    base = Path(tempfile.mkdtemp(prefix="imp-deep-", dir="/tmp"))
    deep = base / ("d" * 60) / ("e" * 40)
    deep.mkdir(parents=True)
    for p in (base, base / ("d" * 60), deep):
        shutil.chown(p, "postgres")
    pg = LocalPostgres(datadir=deep / "data", throwaway=False)
    try:
        with pg:
            with psycopg.connect(pg.socket_dsn()) as c:
                assert c.execute("SELECT 1").fetchone() == (1,)
            assert pg.socket_dir.parent == Path(tempfile.gettempdir())
            assert pg.socket_dir == LocalPostgres(datadir=deep / "data").socket_dir
    finally:
        pg.stop()
        shutil.rmtree(pg.socket_dir, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)


def test_a_socket_directory_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    """The deep data directory's socket directory sits in the shared /tmp: one planted there
    as a symbolic link (root would chown its target) is refused before anything starts."""
    base = Path(tempfile.mkdtemp(prefix="imp-deep-", dir="/tmp"))
    pg = LocalPostgres(datadir=base / ("d" * 100) / "data", throwaway=False)
    target = tmp_path / "elsewhere"
    target.mkdir()
    owner = target.stat().st_uid
    try:
        pg.socket_dir.symlink_to(target)
        with pytest.raises(embedded.EmbeddedPostgresError, match="socket directory"):
            pg._make_socket_dir()
        assert target.stat().st_uid == owner
    finally:
        pg.socket_dir.unlink(missing_ok=True)
        shutil.rmtree(base, ignore_errors=True)
