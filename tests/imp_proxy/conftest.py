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

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench.proxy_process import ProxyProcess as ProxyProcess
from bench.proxy_process import launch_proxy as launch_proxy

ROOT = Path(__file__).resolve().parents[2]


def via_proxy(dsn: str, port: int, **extra: Any) -> str:
    """The same DSN, but pointing at the proxy's port."""
    return psycopg.conninfo.make_conninfo(dsn, **{"host": "127.0.0.1", "port": port, **extra})


StartProxy = Callable[..., ProxyProcess]


@pytest.fixture(scope="module")
def start_proxy(admin_dsn: str) -> Iterator[StartProxy]:
    started: list[ProxyProcess] = []

    def start(*args: str, upstream: str | None = None, hook: str | None = None,
              sketches: bool = False) -> ProxyProcess:
        extra = list(args)
        if hook is None:
            if "--no-sketches" not in extra and not sketches:
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


