"""sketches.pipelined: one libpq pipeline per batch, against a real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import threading
import time
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from sketches import deltas, lookup, pipelined
from sketches.pipelined import BatchFailed, Step
from sketches.sql import analyse

Conn = psycopg.Connection[Any]


def prepared_texts(conn: Conn, prefix: str = "_imp_p") -> list[str]:
    """The texts of the statements prepared on ``conn`` (server side) under names starting
    with ``prefix`` (by default this module's; psycopg's start with ``_pg3_``), oldest first."""
    rows = conn.execute("SELECT statement FROM pg_prepared_statements"
                        " WHERE starts_with(name, %s) ORDER BY prepare_time",
                        (prefix,)).fetchall()
    return [str(r[0]) for r in rows]


@pytest.fixture
def typed(conn: Conn) -> str:
    conn.execute("DROP TABLE IF EXISTS pl_t")
    conn.execute("CREATE TABLE pl_t (i int, b bigint, n numeric, f float8, t text, ok bool,"
                 " d date, a int[], s pg_snapshot)")
    conn.execute("INSERT INTO pl_t VALUES (1, 2^40, 1.50, 0.1, 'x%y', true, '2026-01-02',"
                 " '{1,NULL,3}', pg_current_snapshot()),"
                 " (NULL, NULL, NULL, 'NaN', NULL, NULL, NULL, NULL, NULL)")
    return "pl_t"


def test_rows_are_the_values_a_cursor_returns(conn: Conn, typed: str) -> None:
    query = b"SELECT * FROM pl_t WHERE i IS DISTINCT FROM $1 ORDER BY i NULLS LAST"
    out = pipelined.run(conn, [Step(b"SELECT 1 WHERE false"), Step(query, (b"7",)),
                               Step(b"SET LOCAL work_mem = '8MB'", prepared=False)])
    expected = conn.execute("SELECT * FROM pl_t WHERE i IS DISTINCT FROM %s"
                            " ORDER BY i NULLS LAST", (7,)).fetchall()
    assert out[0] == []
    assert repr(out[1]) == repr(expected) and len(expected) == 2   # same types too (NaN)
    assert out[2] is None   # a command, not a query


def test_statements_are_prepared_once_per_connection(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        steps = [Step(b"SELECT $1::int + 1", (b"41",)), Step(b"SELECT 2", prepared=False)]
        for _ in range(3):
            assert pipelined.run(c, steps)[0] == [(42,)]
        assert prepared_texts(c) == ["SELECT $1::int + 1"]
    with psycopg.connect(db_dsn, autocommit=True) as other:
        assert prepared_texts(other) == []   # per connection
        other.prepare_threshold = None   # the psycopg setting that prepares nothing
        assert pipelined.run(other, steps)[0] == [(42,)]
        assert prepared_texts(other) == []


def test_a_failing_step_raises_postgres_error_and_skips_the_rest(db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as c:   # inside a transaction, as the delta reads are
        c.execute("CREATE TEMP TABLE pl_seen (x int)")
        steps = [Step(b"INSERT INTO pl_seen VALUES (1)"), Step(b"SELECT 1 / $1::int", (b"0",)),
                 Step(b"INSERT INTO pl_seen VALUES (2)")]
        with pytest.raises(BatchFailed) as info:
            pipelined.run(c, steps)
        assert info.value.sqlstate == "22012" and info.value.step == 1
        assert info.value.message == "division by zero"
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        assert c.pgconn.pipeline_status == psycopg.pq.PipelineStatus.OFF
        c.rollback()
        c.execute("CREATE TEMP TABLE pl_seen (x int)")
        ok = [Step(b"INSERT INTO pl_seen VALUES (3)"), Step(b"SELECT 1 / $1::int", (b"1",))]
        assert pipelined.run(c, ok)[1] == [(1,)]
        assert c.execute("SELECT x FROM pl_seen").fetchall() == [(3,)]


def test_a_statement_that_never_parsed_is_prepared_again(conn: Conn) -> None:
    conn.execute("DROP TABLE IF EXISTS pl_late")
    step = Step(b"SELECT count(*) FROM pl_late")
    with pytest.raises(BatchFailed) as info:
        pipelined.run(conn, [step])
    assert info.value.sqlstate == "42P01"
    conn.execute("CREATE TABLE pl_late (x int)")
    assert pipelined.run(conn, [step]) == [[(0,)]]


def test_statements_deallocated_behind_its_back_are_prepared_again(conn: Conn) -> None:
    step = Step(b"SELECT 'again'")
    assert pipelined.run(conn, [step]) == [[("again",)]]
    conn.execute("DEALLOCATE ALL")
    with pytest.raises(BatchFailed) as info:
        pipelined.run(conn, [step])
    assert info.value.sqlstate == "26000"
    assert pipelined.run(conn, [step]) == [[("again",)]]
    assert prepared_texts(conn) == ["SELECT 'again'"]


def test_least_recently_used_statements_are_closed(conn: Conn,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipelined, "MAX_PREPARED", 2)
    pipelined.forget_all(conn)
    conn.execute("DEALLOCATE ALL")
    for i in range(5):
        pipelined.run(conn, [Step(b"SELECT %d" % i)])
    pipelined.run(conn, [Step(b"SELECT 4")])   # sends the pending closes
    assert prepared_texts(conn) == ["SELECT 3", "SELECT 4"]


def test_waiting_for_postgres_releases_the_gil(db_dsn: str) -> None:
    """The proxy runs maintenance in worker threads: a batch waiting for PostgreSQL must not
    stop its event loop."""
    ticks = 0
    done = threading.Event()

    def batch() -> None:
        with psycopg.connect(db_dsn, autocommit=True) as c:
            pipelined.run(c, [Step(b"SELECT pg_sleep(0.5)")])
        done.set()

    t = threading.Thread(target=batch)
    t.start()
    time.sleep(0.15)   # connected and waiting by now
    start = time.monotonic()
    while not done.is_set() and time.monotonic() - start < 5:
        ticks += 1
        time.sleep(0.001)
    t.join()
    assert done.is_set()
    assert ticks >= 50   # ~1 ms ticks for the ~0.35 s the batch still waited


def test_a_connection_in_pipeline_mode_is_refused(conn: Conn) -> None:
    with conn.pipeline():
        with pytest.raises(pipelined.PipelineBusy):
            pipelined.run(conn, [Step(b"SELECT 1")])


def test_dollar_placeholders() -> None:
    assert pipelined.dollar(b"SELECT %s, '100%%', %s") == b"SELECT $1, '100%', $2"
    assert pipelined.dollar(b"x = %(since)s AND y = %(since)s") == b"x = $1 AND y = $1"
    assert pipelined.dollar(b"SELECT '%%(since)s'") == b"SELECT '%(since)s'"
    for bad in (b"SELECT %(other)s", b"SELECT %b", b"SELECT %s, %(since)s", b"50%"):
        with pytest.raises(ValueError):
            pipelined.dollar(bad)


@pytest.mark.parametrize("value", ["it's", "", 42, -7, Decimal("1.50"), True, None,
                                   dt.date(2026, 1, 2), 2**70])
def test_bound_params_reach_postgres_as_a_cursor_sends_them(conn: Conn,
                                                            value: object) -> None:
    step = pipelined.bound(conn, b"SELECT $1::text", [value])
    got = pipelined.run(conn, [step])[0]
    expected = conn.execute("SELECT %s::text", (value,)).fetchall()
    assert got == expected


def rolled_back_every_way(c: Conn) -> None:
    """The statements tagged ROLLBACK a service connection runs (psycopg clears its own
    prepared statements after each, with DEALLOCATE ALL when it held any)."""
    c.execute("BEGIN")
    c.execute("SAVEPOINT a")
    c.execute("ROLLBACK TO SAVEPOINT a")
    c.execute("ROLLBACK")
    with c.transaction(force_rollback=True):
        c.execute("SELECT 1")
    c.execute("SELECT 1")   # psycopg sends a pending DEALLOCATE ALL before its next query


def test_single_statements_are_prepared_here_so_a_rollback_keeps_every_statement(
        db_dsn: str) -> None:
    """The library's single reads (``lookup.relations``, ``deltas.run``) are prepared by this
    module, not by psycopg, on the library's own connections: psycopg answers a ROLLBACK on a
    connection where it holds prepared statements with DEALLOCATE ALL, which dropped the
    batches' statements too (the next maintenance of every sketch then took the long path)."""
    with psycopg.connect(db_dsn, autocommit=True,
                         prepare_threshold=pipelined.PREPARE_WHEN_ASKED) as c:
        c.execute("CREATE TABLE pl_rel (g int, v int)")
        analysis = analyse("SELECT g, sum(v) FROM pl_rel GROUP BY g HAVING sum(v) > 1")
        for _ in range(2):
            assert lookup.relations(c, analysis).reason is None
            assert deltas.run(c, deltas.Statement("SELECT %s::int + 1", (41,))) == [(42,)]
            assert pipelined.run(c, [Step(b"SELECT 'kept'")]) == [[("kept",)]]
        # the relations check, the read and the batch's statement
        assert len(prepared_texts(c)) == 3
        rolled_back_every_way(c)
        assert "SELECT 'kept'" in prepared_texts(c) and len(prepared_texts(c)) == 3


def test_one_statement_raises_what_psycopg_raises(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, prepare_threshold=pipelined.PREPARE_WHEN_ASKED) as c:
        c.execute("SELECT 1")
        with pytest.raises(psycopg.errors.DivisionByZero) as info:
            pipelined.fetch(c, "SELECT 1 / %s::int", (0,))
        assert info.value.sqlstate == "22012"
        assert info.value.diag.message_primary == "division by zero"
        c.rollback()
        assert pipelined.fetch(c, "SELECT '100%%' || %s", ("x",)) == [("100%x",)]
        assert pipelined.fetch(c, "SELECT '100%'") == [("100%",)]   # no params: no placeholders
        assert pipelined.fetch(c, "SELECT '100%%'", ()) == [("100%",)]   # as psycopg reads it
        assert pipelined.fetch(c, "SELECT 'ü'") == [("ü",)]
        # the failed one too (prepared before it failed); the first after the rollback
        # opened the transaction through psycopg, unprepared
        assert prepared_texts(c) == ["SELECT 1 / $1::int", "SELECT '100%'", "SELECT 'ü'"]


def test_one_statement_on_another_connection_is_prepared_by_psycopg(conn: Conn) -> None:
    """There psycopg may prepare by count and clear with DEALLOCATE ALL: a statement of this
    module could vanish inside a transaction, so psycopg prepares it, and it survives that."""
    for _ in range(3):
        assert pipelined.fetch(conn, "SELECT %s::int * 2", (21,)) == [(42,)]
        rolled_back_every_way(conn)
    assert prepared_texts(conn) == []


def test_one_statement_outside_a_transaction_opens_one_as_psycopg_does(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, prepare_threshold=pipelined.PREPARE_WHEN_ASKED) as c:
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert pipelined.fetch(c, "SELECT %s::int", (1,)) == [(1,)]
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert prepared_texts(c) == []
        assert pipelined.fetch(c, "SELECT %s::int", (1,)) == [(1,)]
        assert prepared_texts(c) == ["SELECT $1::int"]
