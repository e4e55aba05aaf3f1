"""Fixtures for the reliability suite (issue 7): the real proxy as a subprocess — with the
sketch library (the default ``SketchManager``) unless a test asks for a relay — in front of the
session's throwaway PostgreSQL or a dedicated cluster, stopped by PID in the finaliser.

Helpers read the proxy's resources from ``/proc/<pid>`` (open descriptors, TCP sockets, RSS)
so leak checks compare counts before and after, never timings.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.imp_proxy.conftest import ProxyProcess, launch_proxy, via_proxy

__all__ = ["ProxyProcess", "via_proxy", "fd_count", "rss_kib", "wait_until",
           "backend_count", "scalar", "settled_fd_count", "client_legs"]

Rows = list[tuple[Any, ...]]
LaunchProxy = Callable[..., ProxyProcess]


def fd_count(pid: int) -> int:
    """Open file descriptors of a process (sockets, pipes, files)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def client_legs(pid: int, port: int) -> int:
    """Established TCP connections of process ``pid`` whose local port is ``port`` (the
    proxy's client legs), from /proc/<pid>/fd socket inodes and /proc/net/tcp{,6}."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            local_port = int(cols[1].rsplit(":", 1)[1], 16)
            if local_port == port and cols[3] == "01" and cols[9] in inodes:
                n += 1
    return n


def settled_fd_count(pid: int, samples: int = 5, interval: float = 0.1,
                     timeout: float = 10.0) -> int:
    """The process's descriptor count once it stopped changing (closed connections of a
    previous step may still be going away)."""
    deadline = time.monotonic() + timeout
    seen = [fd_count(pid)]
    while time.monotonic() < deadline:
        time.sleep(interval)
        seen.append(fd_count(pid))
        if len(seen) >= samples and len(set(seen[-samples:])) == 1:
            break
    return seen[-1]


def rss_kib(pid: int) -> int:
    """Resident set size of a process in KiB (``VmRSS`` of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def wait_until(predicate: Callable[[], bool], timeout: float = 15.0,
               interval: float = 0.05) -> bool:
    """Polls ``predicate`` until it is true or ``timeout`` passes; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def scalar(dsn: str, query: str, params: tuple[Any, ...] = ()) -> Any:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(query.encode(), params).fetchone()
    assert row is not None
    return row[0]


def backend_count(admin_dsn: str, app: str) -> int:
    """Client backends in PostgreSQL with this application_name."""
    return int(scalar(admin_dsn, "SELECT count(*) FROM pg_stat_activity "
                                 "WHERE application_name = %s", (app,)))


HAVING_T = "SELECT g, sum(v) AS s FROM t GROUP BY g HAVING sum(v) > 5040000 ORDER BY g"
TOPK_T = "SELECT g, count(*) AS n, max(v) AS m FROM t GROUP BY g ORDER BY m DESC, g LIMIT 5"
"""A HAVING and a top-k query over :func:`load_t`'s table, which :func:`move_t` changes."""


def load_t(dsn: str) -> None:
    """Table ``t (g, v)``: 100,000 rows in 1000 groups."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (g int NOT NULL, v int NOT NULL)")
        c.execute("INSERT INTO t SELECT i % 1000, i FROM generate_series(1, 100000) i")
        c.execute("ANALYZE t")


def move_t(dsn: str, n: int) -> None:
    """Write ``n`` of a sequence that moves groups into both queries' answers."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("UPDATE t SET v = v + 90000 WHERE g = %s", (n % 1000,))
        c.execute("INSERT INTO t SELECT 4242 + %s, i FROM generate_series(1, 80) i", (n,))


@pytest.fixture(scope="module")
def launch(admin_dsn: str) -> Iterator[LaunchProxy]:
    """``launch(*flags, upstream=dsn)``: a proxy subprocess (sketches on unless
    ``--no-sketches`` is passed), stopped by PID at module end."""
    started: list[ProxyProcess] = []

    def start(*args: str, upstream: str | None = None) -> ProxyProcess:
        p = launch_proxy(upstream or admin_dsn, *args)
        started.append(p)
        return p

    try:
        yield start
    finally:
        for p in started:
            p.stop()


@pytest.fixture(scope="module")
def sketch_proxy(launch: LaunchProxy) -> ProxyProcess:
    """A proxy with the sketch library, in front of the session's cluster."""
    return launch()


def stats(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """``IMP SHOW STATS`` as a dict."""
    return {str(k): str(v) for k, v in conn.execute("IMP SHOW STATS").fetchall()}
