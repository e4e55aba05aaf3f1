"""A sketched query that waits for another session's lock, through the real proxy.

PostgreSQL takes an autocommit query's snapshot once the query holds its locks: a query
that waited behind a TRUNCATE, an ALTER or a ``LOCK TABLE`` reads what that transaction
committed, and a cancel or a terminate of the waiting backend answers the query. The
wrapping locks the query's tables on the client's backend before it takes the snapshot
(found by a helper's search in session 24: the snapshot was taken before the wait, so the
answer missed the lock holder's rows, and after a ``TRUNCATE; INSERT …`` it was empty),
with ``NOWAIT``: a lock held elsewhere makes the query pass through and wait for its own
locks, never for more (``LOCK`` also locks partitions the query prunes, the children of an
``ONLY`` table, a view's tables: found by the regression search that followed).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from .conftest import ProxyProcess, StartProxy, via_proxy

Conn = psycopg.Connection[Any]

HAVING = "SELECT g, count(*) AS n, max(v) AS m FROM lw GROUP BY g HAVING max(v) >= 990"
TOPK = "SELECT g, sum(v) AS s FROM lw GROUP BY g ORDER BY s DESC, g LIMIT 3"
JOIN = ("SELECT lw.g, count(*) AS n FROM lw JOIN lwd ON lwd.k = lw.g WHERE lwd.cat = 1"
        " GROUP BY lw.g HAVING count(*) > 90")
FILL = "INSERT INTO lw SELECT i, i % 60, (i * 37) % 1000 FROM generate_series(1, 6000) i"
SETTINGS = ("capture_after=1", "fragments=20", "batch_interval=0.3", "state_interval=0.5")


def _library_args() -> list[str]:
    out: list[str] = []
    for s in SETTINGS:
        out += ["--library-setting", s]
    return out


@pytest.fixture
def dsn(fresh_db: Callable[[], str]) -> str:
    dsn = fresh_db()
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE lw (id int PRIMARY KEY, g int, v int)"
                  " WITH (autovacuum_enabled = false)")
        c.execute(FILL + " ORDER BY i % 60")
        c.execute("CREATE TABLE lwd (k int PRIMARY KEY, cat int)")
        c.execute("INSERT INTO lwd SELECT i, i % 3 FROM generate_series(0, 59) i")
        c.execute("ANALYZE lw")
        c.execute("ANALYZE lwd")
    return dsn


@pytest.fixture(scope="module")
def proxy(start_proxy: StartProxy) -> ProxyProcess:
    return start_proxy(*_library_args(), sketches=True)


def _rows(c: Conn, q: str) -> Counter[tuple[Any, ...]]:
    return Counter(c.execute(q).fetchall())


def _warm(p: Conn, d: Conn, q: str) -> None:
    """Answers equal, the tables tracked, the sketch in use."""
    deadline = time.monotonic() + 20
    while True:
        assert _rows(p, q) == _rows(d, q)
        row = d.execute("SELECT count(*) FROM imp.tracked_tables").fetchone()
        if row is not None and row[0] >= 1:
            break
        assert time.monotonic() < deadline, "the table was never tracked"
        time.sleep(0.1)
    for _ in range(3):
        assert _rows(p, q) == _rows(d, q)
    assert dict(p.execute(f"IMP EXPLAIN {q}").fetchall())["decision"] == "use"


def _in_thread(c: Conn, q: str, out: dict[str, Any], key: str) -> threading.Thread:
    def run() -> None:
        try:
            out[key] = _rows(c, q)
        except psycopg.Error as exc:
            out[key] = (exc.sqlstate, str(exc).splitlines()[0])

    t = threading.Thread(target=run)
    t.start()
    return t


def _blocked_then_committed(proxied: Conn, direct: Conn, writer: Conn, q: str,
                            writes: list[str]) -> dict[str, Any]:
    """``writes`` in an open transaction of ``writer``, ``q`` sent through the proxy and
    directly (both wait for its lock), then its COMMIT: both answers, and the one after."""
    writer.execute("BEGIN")
    for w in writes:
        writer.execute(w)
    out: dict[str, Any] = {}
    threads = [_in_thread(proxied, q, out, "proxy"), _in_thread(direct, q, out, "direct")]
    time.sleep(1.0)
    assert not out, out   # both still wait for the lock
    writer.execute("COMMIT")
    for t in threads:
        t.join(30)
    return out


@pytest.mark.parametrize("cursor", [psycopg.Cursor, psycopg.ClientCursor],
                         ids=["extended", "simple"])
@pytest.mark.parametrize("case", ["answered from memory", "maintained", "truncated and reloaded",
                                  "first capture"])
def test_a_query_that_waited_for_a_lock_reads_what_its_holder_committed(
        dsn: str, proxy: ProxyProcess, case: str, cursor: type[psycopg.Cursor[Any]]) -> None:
    q = TOPK if case == "first capture" else HAVING
    writes = {"truncated and reloaded": ["TRUNCATE lw", FILL],
              "first capture": ["LOCK TABLE lw IN ACCESS EXCLUSIVE MODE",
                                "UPDATE lw SET v = 100000 WHERE id = 7"]}.get(
        case, ["LOCK TABLE lw IN ACCESS EXCLUSIVE MODE",
               "INSERT INTO lw VALUES (900001, 1, 999), (900002, 2, 999)"])
    with psycopg.connect(via_proxy(dsn, proxy.port), autocommit=True,
                         cursor_factory=cursor) as p, \
            psycopg.connect(dsn, autocommit=True) as d, \
            psycopg.connect(dsn, autocommit=True) as d2, \
            psycopg.connect(dsn, autocommit=True) as w:
        if case != "first capture":
            _warm(p, d, q)
        if case == "maintained":   # a commit elsewhere: no answer from memory
            d.execute("CREATE TABLE lw_other AS SELECT 1 AS x")
        before = _rows(d, q)
        out = _blocked_then_committed(p, d2, w, q, writes)
        after = _rows(d, q)
        assert out["direct"] == after
        assert (after == before) == (case == "truncated and reloaded")
        assert out["proxy"] == out["direct"], (out, before)


def _waiting_then(proxy: ProxyProcess, dsn: str, q: str, setup: list[str],
                  act: Callable[[Conn, int], None]) -> dict[str, Any]:
    """``q`` through the proxy and directly, each waiting for another session's ACCESS
    EXCLUSIVE lock, then ``act(killer, pid of the waiting backend)``: each outcome."""
    res: dict[str, Any] = {}
    for name, target in (("proxy", via_proxy(dsn, proxy.port)), ("direct", dsn)):
        with psycopg.connect(target, autocommit=True) as c, \
                psycopg.connect(dsn, autocommit=True) as w, \
                psycopg.connect(dsn, autocommit=True) as k:
            if name == "proxy":
                with psycopg.connect(dsn, autocommit=True) as d:
                    _warm(c, d, q)
            for s in setup:
                c.execute(s)
            row = c.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            w.execute("BEGIN")
            w.execute("LOCK TABLE lw IN ACCESS EXCLUSIVE MODE")
            out: dict[str, Any] = {}
            t = _in_thread(c, q, out, "r")
            time.sleep(0.7)
            act(k, int(row[0]))
            t.join(10)
            res[name] = out.get("r", "still waiting 10 s after the act")
            w.execute("ROLLBACK")
            t.join(20)
    return res


@pytest.mark.parametrize(("act", "error"), [
    ("SELECT pg_terminate_backend(%s)",
     ("57P01", "terminating connection due to administrator command")),
    ("SELECT pg_cancel_backend(%s)", ("57014", "canceling statement due to user request")),
], ids=["terminated", "cancelled"])
def test_a_backend_ended_or_cancelled_while_it_waits_gives_postgresqls_error(
        dsn: str, proxy: ProxyProcess, act: str, error: tuple[str, str]) -> None:
    """PostgreSQL's FATAL reaches the client (inside the proxy's own statements, replies are
    swallowed: the client saw the connection closed without it), and a cancel ends the query
    (it ended the wrapping's lock wait, and the client's query then waited once more)."""
    res = _waiting_then(proxy, dsn, HAVING, [], lambda k, pid: k.execute(act, (pid,)))
    assert res["direct"] == error
    assert res["proxy"] == res["direct"], res


def test_a_statement_timeout_during_the_wait_gives_postgresqls_error(
        dsn: str, proxy: ProxyProcess) -> None:
    res = _waiting_then(proxy, dsn, HAVING, ["SET statement_timeout = '400ms'"],
                        lambda k, pid: None)
    assert res["direct"] == ("57014", "canceling statement due to statement timeout")
    assert res["proxy"] == res["direct"], res


def test_a_lock_queued_behind_the_wrapping_never_hangs_it(
        dsn: str, start_proxy: StartProxy) -> None:
    """While a service connection prepares, the client's backend holds ACCESS SHARE on the
    query's tables. An ACCESS EXCLUSIVE request queued behind it queued the service
    connection's own read of a table (a join's partner lookup) behind itself: each waited
    for the other through the proxy, where PostgreSQL's deadlock detector cannot see it,
    until the service connection's bounded lock wait ended it. The service transaction now
    takes the query's tables first (``router.LOCK_QUEUED``), before the hook's work: the
    request queues behind both, the query is answered as PostgreSQL answers a query sent
    before it (the rows before the write), and then the lock is granted."""
    slow = start_proxy(*_library_args(), hook="tests.imp_proxy.hooks:slow_sketch_manager")
    with psycopg.connect(via_proxy(dsn, slow.port), autocommit=True) as p, \
            psycopg.connect(dsn, autocommit=True) as d, \
            psycopg.connect(dsn, autocommit=True) as x:
        _warm(p, d, JOIN)
        d.execute("INSERT INTO lw SELECT 700000 + i, 1, 5 FROM generate_series(1, 50) i")
        before = _rows(d, JOIN)
        out: dict[str, Any] = {}
        t = _in_thread(p, JOIN, out, "proxy")
        time.sleep(0.5)   # the wrapping holds its locks; the service connection sleeps
        x.execute("SET lock_timeout = '30s'")
        x.execute("BEGIN")
        x.execute("LOCK TABLE lwd IN ACCESS EXCLUSIVE MODE")   # granted once the query let go
        x.execute("UPDATE lwd SET cat = 1 WHERE k = 2")
        x.execute("COMMIT")
        t.join(30)
        assert _rows(d, JOIN) != before
        assert out["proxy"] == before


@pytest.mark.parametrize("case", ["a pruned partition", "the child of an ONLY table",
                                  "a view's partition"])
def test_a_lock_on_a_relation_the_query_does_not_lock_never_delays_it(
        dsn: str, proxy: ProxyProcess, case: str) -> None:
    """PostgreSQL answers at once while another session holds ACCESS EXCLUSIVE on a relation
    the query does not lock; so must the proxy (found: it waited for the holder, or failed
    with 57014 under a statement_timeout)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE pt (id int, g int, v int) PARTITION BY RANGE (id)")
        c.execute("CREATE TABLE pt1 PARTITION OF pt FOR VALUES FROM (0) TO (5000)")
        c.execute("CREATE TABLE pt2 PARTITION OF pt FOR VALUES FROM (5000) TO (10000)")
        c.execute("INSERT INTO pt SELECT i, i % 50, i FROM generate_series(0, 9999) i")
        c.execute("CREATE TABLE ip (id int, g int, v int)")
        c.execute("CREATE TABLE ic () INHERITS (ip)")
        c.execute("INSERT INTO ip SELECT i, i % 50, i FROM generate_series(0, 4999) i")
        c.execute("INSERT INTO ic SELECT i, i % 50, i FROM generate_series(0, 4999) i")
        c.execute("CREATE VIEW ptv AS SELECT * FROM pt")
        for t in ("pt", "ip", "ic"):
            c.execute(f"ANALYZE {t}")
    q, locked = {
        "a pruned partition": ("SELECT g, count(*) AS n FROM pt WHERE id < 5000 GROUP BY g"
                               " HAVING count(*) > 80", "pt2"),
        "the child of an ONLY table": ("SELECT g, count(*) AS n FROM ONLY ip GROUP BY g"
                                       " HAVING count(*) > 80", "ic"),
        "a view's partition": ("SELECT g, count(*) AS n FROM ptv WHERE id < 5000 GROUP BY g"
                               " HAVING count(*) > 80", "pt2")}[case]
    with psycopg.connect(via_proxy(dsn, proxy.port), autocommit=True) as p, \
            psycopg.connect(dsn, autocommit=True) as d, \
            psycopg.connect(dsn, autocommit=True) as w:
        for _ in range(3):
            assert _rows(p, q) == _rows(d, q)
        w.execute("BEGIN")
        w.execute(f"LOCK TABLE {locked} IN ACCESS EXCLUSIVE MODE")
        try:
            for _ in range(3):
                out: dict[str, Any] = {}
                _in_thread(p, q, out, "proxy").join(20)   # a hang, not a speed, detector
                assert out.get("proxy", "still waiting for the lock") == _rows(d, q)
        finally:
            w.execute("ROLLBACK")
