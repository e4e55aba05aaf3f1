"""PgBouncer as the proxy's upstream (imp-proxy → PgBouncer → PostgreSQL), in its three pool
modes: every answer PostgreSQL's own, and nothing of the proxy's left on the pooler's server
connections for its other clients."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench.pgbench_bench import pgbouncer

from .conftest import HAVING_T, TOPK_T, LaunchProxy, load_t, move_t, via_proxy

POOL_SIZE = 4

@dataclass(frozen=True)
class Pooler:
    direct: str   # the database, directly
    bouncer: str  # the database through PgBouncer


Pooled = Callable[[str], AbstractContextManager[Pooler]]


@pytest.fixture
def pooled(fresh_db: Callable[[], str]) -> Iterator[Pooled]:
    """``with pooled(mode) as db``: a new database with table ``t`` behind a PgBouncer in pool
    mode ``mode`` with ``POOL_SIZE`` server connections (stopped by PID on exit)."""
    work = Path(tempfile.mkdtemp(prefix="imp-pgbouncer-"))

    @contextmanager
    def start(mode: str) -> Iterator[Pooler]:
        dsn = fresh_db()
        load_t(dsn)
        info = psycopg.conninfo.conninfo_to_dict(dsn)
        with pgbouncer(str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432),
                       work / mode, mode=mode, pool_size=POOL_SIZE) as target:
            yield Pooler(dsn, psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1",
                                                             port=target.port))

    try:
        yield start
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _same(proxied: psycopg.Connection[Any], direct: psycopg.Connection[Any], q: str) -> None:
    assert proxied.execute(q).fetchall() == direct.execute(q).fetchall(), q


def _rounds(proxied: str, direct: str, rounds: int) -> set[str]:
    """``rounds`` of both queries through ``proxied``, each twice and compared with PostgreSQL,
    then asked ``IMP EXPLAIN``; a write between rounds. Returns the decisions seen."""
    decisions: set[str] = set()
    with psycopg.connect(proxied, autocommit=True, prepare_threshold=None) as pc, \
            psycopg.connect(direct, autocommit=True) as dc:
        for n in range(rounds):
            for q in (HAVING_T, TOPK_T):
                _same(pc, dc, q)
                _same(pc, dc, q)
                plan: dict[Any, Any] = dict(pc.execute(f"IMP EXPLAIN {q}").fetchall())
                decisions.add(str(plan["decision"]))
            move_t(direct, n)
    return decisions


def _settings_of_every_server(dsn: str) -> set[tuple[str, str]]:
    """``lock_timeout`` and ``idle_in_transaction_session_timeout`` as each of the pooler's
    ``POOL_SIZE`` server connections has them (one transaction open on each at once)."""
    conns = [psycopg.connect(dsn, autocommit=True, prepare_threshold=None)
             for _ in range(POOL_SIZE)]
    seen = set()
    try:
        for c in conns:
            c.execute("BEGIN")
            seen.add((str(c.execute("SHOW lock_timeout").fetchone()[0]),  # type: ignore[index]
                      str(c.execute(
                          "SHOW idle_in_transaction_session_timeout").fetchone()[0])))  # type: ignore[index]
        return seen
    finally:
        for c in conns:
            c.close()


def test_transaction_pooling_keeps_the_proxys_settings_off_the_pooled_servers(
        pooled: Pooled, launch: LaunchProxy) -> None:
    """Found by a helper's search (session 26): the service connections' session-level
    ``lock_timeout = 2s`` and ``idle_in_transaction_session_timeout = 0`` stayed on whichever
    server connection the pooler ran them on; the proxy's clients (and the pooler's) then gave
    up a lock wait after 2 s with 55P03 and lost the database's idle limit."""
    with pooled("transaction") as db:
        bouncer, direct = db.bouncer, db.direct
        name = psycopg.conninfo.conninfo_to_dict(direct)["dbname"]
        with psycopg.connect(direct, autocommit=True) as c:
            c.execute(f'ALTER DATABASE "{name}" SET idle_in_transaction_session_timeout = \'1h\'')
        assert _settings_of_every_server(bouncer) == {("0", "1h")}   # the pooler alone
        p = launch(upstream=bouncer)
        proxied = via_proxy(bouncer, p.port)
        with psycopg.connect(proxied, autocommit=True, prepare_threshold=None) as pc, \
                psycopg.connect(direct, autocommit=True) as dc:
            for n in range(4):   # captures and maintenances on service connections
                _same(pc, dc, HAVING_T)
                _same(pc, dc, TOPK_T)
                move_t(direct, n)
        assert _settings_of_every_server(proxied) == {("0", "1h")}
        assert _settings_of_every_server(bouncer) == {("0", "1h")}
        _lock_wait_outlasts(proxied, direct, seconds=2.5)


def _lock_wait_outlasts(proxied: str, direct: str, seconds: float) -> None:
    """A query through the proxy waits for a lock held ``seconds``, as PostgreSQL has it
    (``lock_timeout`` 0), on each of the pooler's server connections."""
    holding = threading.Event()

    def hold() -> None:
        with psycopg.connect(direct, autocommit=True) as c:
            c.execute("BEGIN")
            c.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
            holding.set()
            time.sleep(seconds)
            c.execute("COMMIT")

    conns = [psycopg.connect(proxied, autocommit=True, prepare_threshold=None)
             for _ in range(POOL_SIZE)]
    try:
        for c in conns:
            c.execute("BEGIN")   # each client on a server connection of its own
        th = threading.Thread(target=hold)
        th.start()
        try:
            assert holding.wait(10)
            for c in conns:
                assert c.execute("SELECT count(*) FROM t").fetchone() is not None
        finally:
            th.join()
    finally:
        for c in conns:
            c.close()


def test_statement_pooling_passes_every_query_through(pooled: Pooled,
                                                      launch: LaunchProxy) -> None:
    """Found by a helper's search (session 26): behind statement pooling, the wrapping's
    ``BEGIN`` was answered ``FATAL transaction blocks not allowed in statement pooling mode``
    and the client's connection closed on its first sketchable query."""
    with pooled("statement") as db:
        bouncer, direct = db.bouncer, db.direct
        p = launch(upstream=bouncer)
        proxied = via_proxy(bouncer, p.port)
        assert _rounds(proxied, direct, 3) == {"passthrough"}
        with psycopg.connect(proxied, autocommit=True, prepare_threshold=None) as pc:
            plan: dict[Any, Any] = dict(pc.execute(f"IMP EXPLAIN {HAVING_T}").fetchall())
        assert plan["decision"] == "passthrough"
        assert "statement pooler" in str(plan["reason"])
        assert p.proc.poll() is None


@pytest.mark.parametrize("mode", ["session", "transaction"])
def test_session_and_transaction_pooling_answer_exactly(pooled: Pooled, launch: LaunchProxy,
                                                        mode: str) -> None:
    """Through a pooler that keeps a transaction on one server connection, sketches are used
    and every answer is PostgreSQL's, with writes in between."""
    with pooled(mode) as db:
        bouncer, direct = db.bouncer, db.direct
        p = launch(upstream=bouncer)
        decisions = _rounds(via_proxy(bouncer, p.port), direct, 6)
        assert "use" in decisions, decisions
