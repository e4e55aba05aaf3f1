"""imp_proxy.router's lexical prefilter: the gate every SELECT passes while sketching is on."""

from __future__ import annotations

import re
import threading
import time
from typing import cast

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imp_proxy.router import PerDatabase, PrepareCancelled, Router, ServiceCancel, prefilter
from sketches import lru

_WORDS = ["SELECT", "select", "SeLeCt", "with", "(", "group", "GROUP", "By", "ORDER", "oRdEr",
          "having", "LIMIT", "fetch", "Distinct", "orders", "grouped", "x_limit", "limit_",
          "sum(v)", "FROM", "t", ";", "';'", "\t", "\n", " ", "é", "ǅ", "K", "ſ", "$1", "1"]


def reference(sql: bytes) -> bool:
    """The gate as first written: case-insensitive patterns on the text as it is."""
    if not re.match(rb"\A(?:\s|--[^\n]*(?:\n|\Z)|/\*.*?\*/)*(?:select|with|\()", sql,
                    re.IGNORECASE | re.DOTALL):
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
    assert prefilter(b"/* app */ SELECT g FROM t GROUP BY g")
    assert prefilter(b"-- report\n  -- by group\nselect g from t group by g")
    assert prefilter(b"/* a\n b */\n/**/(SELECT g FROM t GROUP BY g)")
    assert not prefilter(b"/* never closed SELECT g FROM t GROUP BY g")
    assert not prefilter(b"-- SELECT g FROM t GROUP BY g")
    assert not prefilter(b"/* x */ UPDATE t SET g = 1 WHERE g IN (SELECT g FROM t GROUP BY g)")


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


class _SettingsHook:
    """A database's hook for :class:`PerDatabase`: records its ``configure`` calls."""

    def __init__(self) -> None:
        self.configured: list[tuple[str, str]] = []

    def configure(self, name: str, value: str) -> None:
        if name not in ("strategy", "batch_size"):
            raise KeyError(name)
        self.configured.append((name, value))


def test_repeated_imp_set_keeps_one_replay_entry_per_setting() -> None:
    """Each new database's hook is given the IMP SET library settings: the latest value per
    name (found: every IMP SET was appended to the replay list for ever, 40,000 entries after
    40,000 IMP SETs, each replayed on the next database's hook)."""
    per = PerDatabase(_SettingsHook)
    early = cast(_SettingsHook, per.for_database("early"))
    per.configure("strategy", "eager")
    per.configure("batch_size", "7")
    for i in range(1000):
        per.configure("strategy", ("lazy", "eager")[i % 2])
    per.configure("batch_size", "9")
    with pytest.raises(KeyError):
        per.configure("nope", "1")
    late = cast(_SettingsHook, per.for_database("late"))   # first used after the IMP SETs
    assert late.configured == [("strategy", "eager"), ("batch_size", "9")]
    assert per.settings() == late.configured
    # a hook made before them was given each, in order
    assert len(early.configured) == 1003
    assert early.configured[-2:] == [("strategy", "eager"), ("batch_size", "9")]


def test_the_decision_cache_holds_a_bounded_number_of_characters(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Decisions are cached per query text, at most ``cache_size`` texts and at most
    ``lru.MAX_CHARS`` characters of them: long texts (a 256 KiB comment each) no longer cost
    memory up to the entry count (session 26's resource search: +218 MiB)."""
    monkeypatch.setattr(lru, "MAX_CHARS", 1 << 20)
    router = Router(None, None, cache_size=1000)
    long = [f"SELECT {i} /* {'x' * (256 << 10)} */" for i in range(12)]
    for text in long:
        router.refuse(text, "a foreign table")
    kept = [t for t in long if router.cached(t) is not None]
    assert kept == long[-3:]   # three of 256 KiB fit in 1 MiB: the most recent
    for i in range(1500):
        router.refuse(f"SELECT {i}", "short")
    assert router.cached("SELECT 1499") is not None and router.cached("SELECT 0") is None
