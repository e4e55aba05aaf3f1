"""imp_proxy.router's lexical prefilter: the gate every SELECT passes while sketching is on."""

from __future__ import annotations

import re
import threading
import time

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imp_proxy.router import PrepareCancelled, ServiceCancel, prefilter

_WORDS = ["SELECT", "select", "SeLeCt", "with", "(", "group", "GROUP", "By", "ORDER", "oRdEr",
          "having", "LIMIT", "fetch", "Distinct", "orders", "grouped", "x_limit", "limit_",
          "sum(v)", "FROM", "t", ";", "';'", "\t", "\n", " ", "é", "ǅ", "K", "ſ", "$1", "1"]


def reference(sql: bytes) -> bool:
    """The gate as first written: case-insensitive patterns on the text as it is."""
    if not re.match(rb"\A\s*(?:select|with|\()", sql, re.IGNORECASE):
        return False
    body = sql.rstrip().rstrip(b";")
    if b";" in body:
        return False
    return re.search(rb"\b(?:group|order|having|limit|fetch|distinct)\b", body,
                     re.IGNORECASE) is not None


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_WORDS), max_size=12), st.sampled_from([" ", "", "\n"]))
def test_prefilter_matches_the_case_insensitive_reference(words: list[str], sep: str) -> None:
    sql = sep.join(words).encode()
    assert prefilter(sql) == reference(sql)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_prefilter_matches_the_reference_on_any_bytes(tail: bytes) -> None:
    for head in (b"select a from t group by a", b"SELECT ", b"with x as ("):
        assert prefilter(head + tail) == reference(head + tail)


def test_prefilter_examples() -> None:
    assert prefilter(b"SELECT g, sum(v) FROM t GROUP BY g HAVING sum(v) > 3")
    assert prefilter(b"  select * from t order by x limit 10;")
    assert not prefilter(b"SELECT abalance FROM pgbench_accounts WHERE aid = $1;")
    assert not prefilter(b"SELECT * FROM orders")            # a keyword inside a word
    assert not prefilter(b"SELECT 1; SELECT a FROM t GROUP BY a")
    assert not prefilter(b"UPDATE t SET a = 1 WHERE a IN (SELECT a FROM u GROUP BY a)")


def test_a_service_cancel_interrupts_the_prepare_it_is_attached_to(db_dsn: str) -> None:
    """A client's cancel reaches the service connection preparing its query: a statement
    running there fails with PostgreSQL's 57014, even when the first cancel lands between
    statements (it is sent again until the prepare lets go); a cancel that came first stops
    the prepare before it starts; a connection let go is never cancelled."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        early = ServiceCancel()
        early.cancel()
        with pytest.raises(PrepareCancelled), early.attached(conn):
            pass
        late = ServiceCancel()
        errors: list[BaseException] = []
        attached = threading.Event()

        def prepare() -> None:
            with late.attached(conn):
                attached.set()
                time.sleep(0.5)   # between statements: a cancel now is dropped
                try:
                    conn.execute("SELECT pg_sleep(60)")
                except psycopg.Error as exc:
                    errors.append(exc)
        worker = threading.Thread(target=prepare)
        worker.start()
        attached.wait(10)
        late.cancel()   # returns once the prepare let go of the connection
        worker.join(60)
        assert not worker.is_alive()
        assert [type(e) for e in errors] == [psycopg.errors.QueryCanceled]
        late.cancel()   # detached: nothing is sent
        assert conn.execute("SELECT 1").fetchone() == (1,)
