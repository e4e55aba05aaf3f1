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
