"""psycopg through the proxy, each behaviour compared with psycopg directly against PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg import errors, pq
from psycopg.rows import tuple_row

Conn = psycopg.Connection[tuple[Any, ...]]


@pytest.fixture(scope="module", autouse=True)
def data(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(10,2),"
                  " ts timestamptz, tags text[], blob bytea)")
        c.execute("INSERT INTO items SELECT g, 'item ' || g, g * 1.25,"
                  " '2024-01-01 00:00+00'::timestamptz + g * interval '1 hour',"
                  " ARRAY['a' || g, 'b'], decode(md5(g::text), 'hex')"
                  " FROM generate_series(1, 500) g")


def both(db_dsn: str, proxy_dsn: str, fn: Callable[[Conn], Any], **kw: Any) -> Any:
    """Runs ``fn`` on a direct and on a proxied connection; asserts equal results."""
    results = []
    for dsn in (db_dsn, proxy_dsn):
        with psycopg.connect(dsn, autocommit=True, row_factory=tuple_row, **kw) as c:
            results.append(fn(c))
    assert results[0] == results[1]
    return results[1]


def test_simple_and_multi_statement(db_dsn: str, proxy_dsn: str) -> None:
    def run(c: Conn) -> list[Any]:
        cur = c.cursor()
        cur.execute("SELECT count(*) FROM items; SELECT name FROM items WHERE id = 7;"
                    " SELECT 1 WHERE false")
        out = []
        while True:
            out.append((cur.statusmessage, cur.fetchall()))
            if not cur.nextset():
                break
        return out

    out = both(db_dsn, proxy_dsn, run)
    assert out == [("SELECT 1", [(500,)]), ("SELECT 1", [("item 7",)]), ("SELECT 0", [])]


def test_extended_with_params_and_types(db_dsn: str, proxy_dsn: str) -> None:
    def run(c: Conn) -> list[Any]:
        rows = c.execute("SELECT id, name, price, ts, tags, blob FROM items"
                         " WHERE id BETWEEN %s AND %s AND name LIKE %s ORDER BY id",
                         (10, 20, "item 1%")).fetchall()
        return rows

    rows = both(db_dsn, proxy_dsn, run)
    assert len(rows) == 10 and rows[0][2] == Decimal("12.50")


def test_named_prepared_statements_reused(db_dsn: str, proxy_dsn: str) -> None:
    def run(c: Conn) -> list[Any]:
        c.prepare_threshold = 0
        out = [c.execute("SELECT name FROM items WHERE id = %s", (i,)).fetchone()
               for i in range(1, 8)]
        out.append(c.execute("SELECT count(*) FROM pg_prepared_statements").fetchone())
        return out

    out = both(db_dsn, proxy_dsn, run)
    assert out[-1] is not None and out[-1][0] >= 1


def test_binary_results(db_dsn: str, proxy_dsn: str) -> None:
    def run(c: Conn) -> list[Any]:
        cur = c.cursor(binary=True)
        cur.execute("SELECT id, price, ts, tags, blob FROM items WHERE id < %b ORDER BY id",
                    (50,))
        return cur.fetchall()

    assert len(both(db_dsn, proxy_dsn, run)) == 49


def test_pipeline_mode(db_dsn: str, proxy_dsn: str) -> None:
    def run(c: Conn) -> list[Any]:
        with c.pipeline() as p:
            curs = [c.execute("SELECT name FROM items WHERE id = %s", (i,)) for i in range(1, 30)]
            bad = c.cursor()
            p.sync()
            results = [cur.fetchone() for cur in curs]
        with pytest.raises(errors.DivisionByZero), c.pipeline():
            bad.execute("SELECT 1/0")
            c.execute("SELECT 2")  # discarded until Sync by the server
        results.append(c.execute("SELECT 3").fetchone())
        return results

    out = both(db_dsn, proxy_dsn, run)
    assert out[0] == ("item 1",) and out[-1] == (3,)


def test_server_side_cursor(db_dsn: str, proxy_dsn: str) -> None:
    def run(c: Conn) -> list[Any]:
        with c.transaction(), c.cursor(name="ssc") as cur:
            cur.itersize = 37
            cur.execute("SELECT id, name FROM items ORDER BY id")
            first = cur.fetchmany(5)
            rest = list(cur)
        return [first, len(rest), rest[-1]]

    out = both(db_dsn, proxy_dsn, run)
    assert out[1] == 495


def test_copy_both_ways(db_dsn: str, proxy_dsn: str) -> None:
    def run(c: Conn) -> list[Any]:
        c.execute("CREATE TEMP TABLE cp (a int, b text)")
        with c.cursor().copy("COPY cp FROM STDIN") as cp:
            for i in range(20000):
                cp.write_row((i, f"row {i}" * 3))
        chunks = []
        with c.cursor().copy("COPY (SELECT * FROM cp ORDER BY a) TO STDOUT") as cp:
            for chunk in cp:
                chunks.append(bytes(chunk))
        with c.cursor().copy("COPY cp (a, b) FROM STDIN (FORMAT binary)") as cp:
            cp.set_types(["int4", "text"])
            cp.write_row((-1, "binary"))
        return [b"".join(chunks), c.execute("SELECT count(*), sum(a) FROM cp").fetchone()]

    out = both(db_dsn, proxy_dsn, run)
    assert out[1] == (20001, sum(range(20000)) - 1)


def test_copy_from_stdin_failure(db_dsn: str, proxy_dsn: str) -> None:
    def run(c: Conn) -> list[Any]:
        c.execute("CREATE TEMP TABLE cpf (a int)")
        with pytest.raises(errors.InvalidTextRepresentation) as ei:  # noqa: SIM117
            with c.cursor().copy("COPY cpf FROM STDIN") as cp:
                cp.write(b"1\nnot a number\n")
        return [ei.value.sqlstate, c.execute("SELECT count(*) FROM cpf").fetchone(),
                c.info.transaction_status]

    assert both(db_dsn, proxy_dsn, run)[1] == (0,)


def test_errors_transactions_and_status(db_dsn: str, proxy_dsn: str) -> None:
    def run(c: Conn) -> list[Any]:
        out: list[Any] = []
        c.autocommit = False
        c.execute("SELECT 1")
        out.append(c.info.transaction_status)
        with pytest.raises(errors.UndefinedTable) as ei:
            c.execute("SELECT * FROM no_such_table")
        out.append((ei.value.diag.sqlstate, ei.value.diag.message_primary))
        out.append(c.info.transaction_status)
        with pytest.raises(errors.InFailedSqlTransaction):
            c.execute("SELECT 1")
        c.rollback()
        out.append(c.info.transaction_status)
        c.autocommit = True
        return out

    out = both(db_dsn, proxy_dsn, run)
    assert out[0] == pq.TransactionStatus.INTRANS and out[2] == pq.TransactionStatus.INERROR
    assert out[3] == pq.TransactionStatus.IDLE


def test_notice_parameter_status_and_empty_query(db_dsn: str, proxy_dsn: str) -> None:
    def run(c: Conn) -> list[Any]:
        notices: list[str] = []
        c.add_notice_handler(lambda d: notices.append(f"{d.severity}:{d.message_primary}"))
        c.execute("DO $$ BEGIN RAISE NOTICE 'hello %', 42; END $$")
        c.execute("SET application_name = 'imp-test-app'")
        c.execute("SET TimeZone = 'Asia/Tokyo'")
        res = c.pgconn.exec_(b"")
        return [notices, c.info.parameter_status("application_name"),
                c.info.parameter_status("TimeZone"), res.status]

    out = both(db_dsn, proxy_dsn, run)
    assert out == [["NOTICE:hello 42"], "imp-test-app", "Asia/Tokyo",
                   pq.ExecStatus.EMPTY_QUERY]


def test_listen_notify(proxy_dsn: str) -> None:
    with psycopg.connect(proxy_dsn, autocommit=True) as listener, \
            psycopg.connect(proxy_dsn, autocommit=True) as sender:
        listener.execute("LISTEN imp_chan")
        sender.execute("NOTIFY imp_chan, 'payload-1'")
        sender.execute("SELECT pg_notify('imp_chan', 'payload-2')")
        listener.execute("NOTIFY imp_chan, 'self'")  # delivered with the own backend's pid
        got = [(n.channel, n.payload, n.pid) for n in listener.notifies(timeout=5, stop_after=3)]
        pids = (sender.info.backend_pid, listener.info.backend_pid)
    assert [g[1] for g in got] == ["payload-1", "payload-2", "self"]
    assert got[0][2] == got[1][2] == pids[0]
    assert got[2][2] == pids[1]


def test_startup_parameters_forwarded(db_dsn: str, proxy_dsn: str) -> None:
    def run(c: Conn) -> list[Any]:
        return list(c.execute("SELECT current_setting('application_name'),"
                              " current_setting('search_path'),"
                              " current_setting('extra_float_digits'),"
                              " current_setting('work_mem')").fetchone() or ())

    out = both(db_dsn, proxy_dsn, run, application_name="imp app",
               options="-c search_path=foo,public -c extra_float_digits=3 -c work_mem=7MB")
    assert out == ["imp app", "foo,public", "3", "7MB"]


def test_cancel_through_proxy(proxy_dsn: str) -> None:
    with psycopg.connect(proxy_dsn, autocommit=True) as c:
        pid = c.info.backend_pid
        assert c.execute("SELECT pg_backend_pid()").fetchone() == (pid,)
        timer = threading.Timer(0.5, c.cancel)
        t0 = time.monotonic()
        timer.start()
        with pytest.raises(errors.QueryCanceled):
            c.execute("SELECT pg_sleep(30)")
        timer.join()
        assert time.monotonic() - t0 < 10
        assert c.execute("SELECT 'still usable'").fetchone() == ("still usable",)


def test_many_sequential_and_concurrent_connections(proxy_dsn: str) -> None:
    errors_seen: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            with psycopg.connect(proxy_dsn, autocommit=True) as c:
                for i in range(20):
                    assert c.execute("SELECT %s::int * 2", (k * 100 + i,)).fetchone() == (
                        2 * (k * 100 + i),)
        except BaseException as exc:  # collected and re-raised in the test thread
            errors_seen.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors_seen, errors_seen
