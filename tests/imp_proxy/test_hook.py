"""The sketch wrapping (docs/INTERFACES.md §2) with a real hook against real PostgreSQL:
same results as direct, the hook reads in exactly the client's snapshot, the client never sees
the proxy's own messages, and everything that must pass through does."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from psycopg import errors, pq

from .conftest import ProxyProcess, StartProxy, via_proxy

HOOK = "tests.imp_proxy.hooks:create_hook"
Q = "SELECT grp, count(*) AS n, max(id) AS m FROM probe GROUP BY grp ORDER BY grp"
QP = ("SELECT grp, count(*) AS n, max(id) AS m FROM probe WHERE id >= %s AND grp = %s"
      " GROUP BY grp ORDER BY grp")


@pytest.fixture(scope="module")
def hooked(start_proxy: StartProxy) -> ProxyProcess:
    return start_proxy(hook=HOOK)


@pytest.fixture(scope="module")
def hdsn(db_dsn: str, hooked: ProxyProcess) -> str:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE probe (id bigserial PRIMARY KEY, grp int NOT NULL)")
        c.execute("INSERT INTO probe (grp) SELECT g % 3 FROM generate_series(1, 300) g")
        c.execute("CREATE SCHEMA other")
        c.execute("CREATE TABLE other.probe (id int, grp int)")
        c.execute("INSERT INTO other.probe VALUES (1, 7), (2, 7)")
    return via_proxy(db_dsn, hooked.port)


def stats(c: psycopg.Connection[Any]) -> dict[str, str]:
    return {k: v for k, v in c.execute("IMP SHOW STATS").fetchall()}


def test_simple_query_wrapped_same_result(hdsn: str, db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as d:
        expected = d.execute(Q).fetchall()
    with psycopg.connect(hdsn, autocommit=True) as c:
        before = stats(c)
        notices: list[str] = []
        c.add_notice_handler(lambda n: notices.append(str(n.message_primary)))
        cur = c.execute(Q)
        assert cur.fetchall() == expected
        assert cur.statusmessage == "SELECT 3"
        assert [col.name for col in cur.description or []] == ["grp", "n", "m"]
        assert c.info.transaction_status == pq.TransactionStatus.IDLE
        after = stats(c)
        assert int(after["proxy.wrapped"]) == int(before["proxy.wrapped"]) + 1
        assert int(after["hook.prepares"]) == int(before["hook.prepares"]) + 1
        assert after["hook.last_k"] == "300"
        assert notices == []  # e.g. no "there is no transaction in progress" from the wrapping


def test_hook_reads_in_the_clients_snapshot(hdsn: str, db_dsn: str) -> None:
    """A writer commits rows continuously; for every wrapped query the K the hook read on the
    service connection must equal the max(id) the client's own query saw: same snapshot."""
    stop = threading.Event()

    def writer() -> None:
        with psycopg.connect(db_dsn, autocommit=True) as w:
            while not stop.is_set():
                w.execute("INSERT INTO probe (grp) VALUES (0)")

    t = threading.Thread(target=writer)
    t.start()
    try:
        with psycopg.connect(hdsn, autocommit=True) as c:
            seen = set()
            for _ in range(40):
                rows = c.execute(Q).fetchall()
                top = max(r[2] for r in rows)
                assert sum(r[1] for r in rows) == top  # ids are contiguous in any snapshot
                assert stats(c)["hook.last_k"] == str(top)
                seen.add(top)
    finally:
        stop.set()
        t.join()
    assert len(seen) > 1  # the writer really was running concurrently


@pytest.mark.parametrize("mode", ["text", "binary", "prepared"])
def test_extended_protocol_wrapped(hdsn: str, db_dsn: str, mode: str) -> None:
    sql = QP.replace("%s", "%b") if mode == "binary" else QP
    with psycopg.connect(db_dsn, autocommit=True) as d:
        expected = d.execute(sql, (10, 2)).fetchall()
    with psycopg.connect(hdsn, autocommit=True) as c:
        before = int(stats(c)["proxy.wrapped"])
        for i in range(3):
            got = c.execute(sql, (10, 2), prepare=(mode == "prepared")).fetchall()
            assert got == expected, i
            s = stats(c)
            assert s["hook.last_params"] == "[10, 2]"
            assert c.info.transaction_status == pq.TransactionStatus.IDLE
        assert int(s["proxy.wrapped"]) == before + 3
        # the proxy's own statements are gone, the client's prepared one (if any) remains
        names = [r[0] for r in c.execute("SELECT name FROM pg_prepared_statements").fetchall()]
        assert not any(n.startswith("_imp") for n in names)
        if mode == "prepared":
            assert len(names) == 1


def test_search_path_of_client_used(hdsn: str) -> None:
    with psycopg.connect(hdsn, autocommit=True) as c:
        c.execute("SET search_path = other, public")
        assert c.execute(Q).fetchall() == [(7, 2, 2)]
        s = stats(c)
        # as the session resolves names: pg_catalog (searched first implicitly) spelled out
        assert s["hook.last_search_path"] == "pg_catalog, other, public", sorted(s.items())
        assert s["hook.last_k"] == "2"


def test_not_wrapped_inside_client_transaction_or_when_disabled(hdsn: str) -> None:
    with psycopg.connect(hdsn) as c:  # autocommit off: BEGIN precedes the query
        before = int(stats(c)["proxy.wrapped"])
        c.execute(Q).fetchall()
        c.commit()
        c.autocommit = True
        assert int(stats(c)["proxy.wrapped"]) == before
        c.execute("IMP SET enabled = off")
        c.execute(Q).fetchall()
        assert int(stats(c)["proxy.wrapped"]) == before
        c.execute("imp set ENABLED to on")
        c.execute(Q).fetchall()
        assert int(stats(c)["proxy.wrapped"]) == before + 1


def test_pipelined_batches_pass_through(hdsn: str, db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as d:
        expected = d.execute(QP, (5, 1)).fetchall()
    with psycopg.connect(hdsn, autocommit=True) as c:
        before = int(stats(c)["proxy.wrapped"])
        with c.pipeline():
            curs = [c.execute(QP, (5, 1)) for _ in range(5)]
        assert [cur.fetchall() for cur in curs] == [expected] * 5
        # the first batch may be wrapped (backend idle); the pipelined rest must not be
        assert int(stats(c)["proxy.wrapped"]) <= before + 1


def test_hook_failure_falls_back_to_original(hdsn: str, db_dsn: str) -> None:
    sql = Q.replace("SELECT", "SELECT /* fail_me */", 1)
    passthrough = Q.replace("SELECT", "SELECT /* passthrough_me */", 1)
    with psycopg.connect(db_dsn, autocommit=True) as d:
        expected = d.execute(sql).fetchall()
    with psycopg.connect(hdsn, autocommit=True) as c:
        before = stats(c)
        assert c.execute(sql).fetchall() == expected
        assert c.execute(passthrough).fetchall() == expected
        assert c.execute(sql, prepare=True).fetchall() == expected
        after = stats(c)
        assert int(after["proxy.fallbacks"]) == int(before["proxy.fallbacks"]) + 2
        assert after["proxy.wrapped"] == before["proxy.wrapped"]
        assert c.info.transaction_status == pq.TransactionStatus.IDLE


def test_instrumented_sql_with_other_parameters_falls_back(hdsn: str, db_dsn: str) -> None:
    sql = QP.replace("SELECT", "SELECT /* extra_param_me */", 1)
    with psycopg.connect(db_dsn, autocommit=True) as d:
        expected = d.execute(sql, (10, 2)).fetchall()
    with psycopg.connect(hdsn, autocommit=True) as c:
        before = stats(c)
        assert c.execute(sql, (10, 2)).fetchall() == expected
        after = stats(c)
        assert int(after["proxy.fallbacks"]) == int(before["proxy.fallbacks"]) + 1
        assert after["proxy.wrapped"] == before["proxy.wrapped"]


def test_instrumented_sql_failing_at_parse_falls_back(hdsn: str, db_dsn: str) -> None:
    """The proxy's Parse of the instrumented statement goes in one write with the client's
    Bind/Execute; when PostgreSQL rejects it, nothing of that write reaches the client and
    the client's own messages are sent instead (exact answer, one fallback, session idle)."""
    sql = QP.replace("SELECT", "SELECT /* unparsable_me */", 1)
    with psycopg.connect(db_dsn, autocommit=True) as d:
        expected = d.execute(sql, (10, 2)).fetchall()
    with psycopg.connect(hdsn, autocommit=True) as c:
        for _ in range(2):
            before = stats(c)
            assert c.execute(sql, (10, 2)).fetchall() == expected
            after = stats(c)
            assert int(after["proxy.fallbacks"]) == int(before["proxy.fallbacks"]) + 1
            assert after["proxy.wrapped"] == before["proxy.wrapped"]
            assert c.info.transaction_status == pq.TransactionStatus.IDLE
        assert c.execute("SELECT 1").fetchone() == (1,)


def test_error_in_wrapped_query_reaches_client(hdsn: str) -> None:
    bad = Q.replace("ORDER BY grp", "HAVING 1/(count(*) - count(*)) = 1")
    with psycopg.connect(hdsn, autocommit=True) as c:
        with pytest.raises(errors.DivisionByZero):
            c.execute(bad)
        assert c.info.transaction_status == pq.TransactionStatus.IDLE
        with pytest.raises(errors.DivisionByZero):
            c.execute(bad.replace("FROM probe", "FROM probe WHERE grp >= %s"), (0,))
        assert c.info.transaction_status == pq.TransactionStatus.IDLE
        assert c.execute("SELECT 1").fetchone() == (1,)


def test_non_candidates_untouched(hdsn: str) -> None:
    with psycopg.connect(hdsn, autocommit=True) as c:
        before = stats(c)
        c.execute("SELECT count(*) FROM probe").fetchall()  # no GROUP BY: prefilter
        c.execute("SELECT grp FROM other.probe ORDER BY grp").fetchall()  # hook says no
        c.execute("SELECT grp FROM other.probe ORDER BY grp").fetchall()  # cached decision
        after = stats(c)
        assert after["proxy.wrapped"] == before["proxy.wrapped"]
        assert int(after["hook.classified"]) == int(before["hook.classified"]) + 1
