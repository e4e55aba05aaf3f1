"""Proxy fixtures: the IMP proxy as a subprocess (``python -m imp_proxy serve``) in front of
the session's throwaway PostgreSQL, always stopped by PID in the finaliser.

A subprocess rather than a thread: client libraries may hold the GIL in blocking C calls
(psycopg's cancel does), which would freeze an in-process proxy.

* ``proxy``       — a passthrough proxy (``--no-sketches``), module scope;
* ``proxy_dsn``   — the module database (``db_dsn``) reached through ``proxy``;
* ``start_proxy`` — factory: ``start_proxy(upstream=…, hook="module:factory", extra args…)``;
* ``fresh_db``    — factory for extra empty databases.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]


def via_proxy(dsn: str, port: int, **extra: Any) -> str:
    """The same DSN, but pointing at the proxy's port."""
    return psycopg.conninfo.make_conninfo(dsn, **{"host": "127.0.0.1", "port": port, **extra})


@dataclass
class ProxyProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


_LISTENING = re.compile(r"imp-proxy listening on [^\s]+:(\d+)")


def launch_proxy(upstream: str | None, *args: str, timeout: float = 60.0) -> ProxyProcess:
    """Starts ``python -m imp_proxy serve`` on a free port and waits until it listens
    (``upstream=None``: the proxy's embedded PostgreSQL)."""
    up = ["--upstream", upstream] if upstream is not None else []
    log = Path(tempfile.mkstemp(prefix="imp-proxy-", suffix=".log")[1])
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "imp_proxy", "--log-level", "INFO", "serve",
             "--listen", "127.0.0.1:0", *up, *args],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = _LISTENING.search(log.read_text(errors="replace"))
        if m:
            return ProxyProcess(proc, int(m.group(1)), log)
        if proc.poll() is not None:
            raise RuntimeError(f"proxy exited with {proc.returncode}: {log.read_text()}")
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"proxy did not start within {timeout}s: {log.read_text()}")


StartProxy = Callable[..., ProxyProcess]


@pytest.fixture(scope="module")
def start_proxy(admin_dsn: str) -> Iterator[StartProxy]:
    started: list[ProxyProcess] = []

    def start(*args: str, upstream: str | None = None, hook: str | None = None) -> ProxyProcess:
        extra = list(args)
        if hook is None:
            if "--no-sketches" not in extra:
                extra.append("--no-sketches")
        else:
            extra += ["--hook", hook]
        p = launch_proxy(upstream or admin_dsn, *extra)
        started.append(p)
        return p

    try:
        yield start
    finally:
        for p in started:
            p.stop()


@pytest.fixture(scope="module")
def proxy(start_proxy: StartProxy) -> ProxyProcess:
    return start_proxy()


@pytest.fixture(scope="module")
def proxy_dsn(db_dsn: str, proxy: ProxyProcess) -> str:
    return via_proxy(db_dsn, proxy.port)


@pytest.fixture(scope="module")
def fresh_db(admin_dsn: str) -> Iterator[Callable[[], str]]:
    """Factory for extra empty databases (dropped at module end); returns their DSNs."""
    names: list[str] = []

    def make() -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(admin_dsn, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        names.append(name)
        return psycopg.conninfo.make_conninfo(admin_dsn, dbname=name)

    try:
        yield make
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as c:
            for name in names:
                c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
