"""IMP statements answered by the proxy, in simple and extended protocol, via psycopg and psql."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import errors, pq

from imp_proxy.admin import SKETCH_COLUMNS, AdminError, parse_admin
from imp_proxy.protocol import codec
from imp_proxy.protocol.messages import Bind

from .conftest import ProxyProcess, StartProxy, via_proxy
from .rawclient import RawClient

HOOK = "tests.imp_proxy.hooks:create_hook"
Q = "SELECT grp, count(*) AS n FROM probe GROUP BY grp ORDER BY grp"


@pytest.fixture(scope="module")
def hooked(start_proxy: StartProxy) -> ProxyProcess:
    return start_proxy(hook=HOOK)


@pytest.fixture(scope="module")
def adsn(db_dsn: str, hooked: ProxyProcess) -> str:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE probe (id bigserial PRIMARY KEY, grp int NOT NULL)")
        c.execute("INSERT INTO probe (grp) SELECT g % 4 FROM generate_series(1, 100) g")
    return via_proxy(db_dsn, hooked.port)


def test_parse_admin() -> None:
    assert parse_admin("imp show sketches;").kind == "show_sketches"
    assert parse_admin("  IMP   Show\n STATS ").kind == "show_stats"
    cmd = parse_admin("IMP EXPLAIN SELECT a FROM t GROUP BY a;")
    assert (cmd.kind, cmd.argument) == ("explain", "SELECT a FROM t GROUP BY a")
    assert parse_admin("IMP DROP SKETCH 12").argument == "12"
    assert parse_admin("imp drop all sketches").kind == "drop_all"
    s = parse_admin("IMP SET Enabled TO 'OFF'")
    assert (s.kind, s.argument, s.value) == ("set", "enabled", "off")
    other = parse_admin("IMP SET strategy = 'Eager'")
    assert (other.argument, other.value) == ("strategy", "Eager")
    for bad, state in [("IMP DROP SKETCH x", "22P02"), ("IMP SET = red", "42601"),
                       ("IMP FROB", "42601"), ("IMP", "42601")]:
        with pytest.raises(AdminError) as ei:
            parse_admin(bad)
        assert ei.value.sqlstate == state


@pytest.mark.parametrize("prepare", [False, True])
def test_show_sketches_simple_and_extended(adsn: str, prepare: bool) -> None:
    with psycopg.connect(adsn, autocommit=True) as c:
        for _ in range(3):  # prepared: Parse once, then Bind/Execute the named statement
            cur = c.execute("IMP SHOW SKETCHES", prepare=prepare)
            assert tuple(d.name for d in cur.description or []) == SKETCH_COLUMNS
            rows = cur.fetchall()
            assert len(rows) == 1 and rows[0][0] == "1" and rows[0][2] == "probe"
            assert rows[0][5] == "0, 3" and rows[0][11] is None
            assert cur.statusmessage == "SELECT 1"
        assert c.info.transaction_status == pq.TransactionStatus.IDLE
        bcur = c.cursor(binary=True)
        bcur.execute("imp show sketches")
        assert bcur.fetchall() == rows
        assert c.execute("SELECT 'after'").fetchone() == ("after",)


def kv(c: psycopg.Connection[Any], sql: str, **kw: Any) -> dict[str, Any]:
    cur = c.execute(sql, **kw)
    assert [d.name for d in cur.description or []] == ["key", "value"]
    return dict(cur.fetchall())


def test_explain(adsn: str) -> None:
    with psycopg.connect(adsn, autocommit=True) as c:
        e = kv(c, f"IMP EXPLAIN {Q}")
        assert e["decision"] == "use" and e["sketch_id"] == "1" and e["candidate"] == "true"
        assert "id <= 100" in e["instrumented_sql"] and e["reason"] == "probe sketch"
        e2 = kv(c, f"IMP EXPLAIN {Q}", prepare=True)
        assert e2["decision"] == "use"
        n = kv(c, "IMP EXPLAIN SELECT 1")
        assert n["decision"] == "passthrough" and n["instrumented_sql"] is None
        assert n["reason"] == "not a probe query"
        assert c.info.transaction_status == pq.TransactionStatus.IDLE
        # the EXPLAIN's own snapshot transaction is gone: nothing pending, no leftovers
        assert c.execute("SELECT count(*) FROM pg_prepared_statements"
                         " WHERE name LIKE '\\_imp%'").fetchone() == (0,)
    with psycopg.connect(adsn) as c:  # inside a client transaction: would pass through
        c.execute("SELECT 1")
        t = kv(c, f"IMP EXPLAIN {Q}")
        assert t["decision"] == "passthrough" and "transaction" in t["reason"]
        assert c.info.transaction_status == pq.TransactionStatus.INTRANS
        c.rollback()


def test_stats_set_and_errors(adsn: str) -> None:
    with psycopg.connect(adsn, autocommit=True) as c:
        s = kv(c, "IMP SHOW STATS")
        assert s["session.enabled"] == "true" and s["library"] == "true"
        assert "hook.prepares" in s and "proxy.wrapped" in s
        cur = c.execute("IMP SET enabled = off")
        assert cur.statusmessage == "IMP SET" and cur.description is None
        assert kv(c, "IMP SHOW STATS")["session.enabled"] == "false"
        assert kv(c, f"IMP EXPLAIN {Q}")["decision"] == "passthrough"
        c.execute("IMP SET enabled = on", prepare=True)
        assert kv(c, "IMP SHOW STATS")["session.enabled"] == "true"
        c.execute("IMP SET strategy = eager")  # a library setting: the hook's configure()
        assert kv(c, "IMP SHOW STATS")["hook.strategy"] == "eager"
        for sql, exc in [("IMP SET enabled = maybe", errors.InvalidParameterValue),
                         ("IMP SET nope = 1", errors.UndefinedObject),
                         ("IMP SET strategy = sideways", errors.InvalidParameterValue),
                         ("IMP SHOW EVERYTHING", errors.SyntaxError)]:
            for prepare in (False, True):
                with pytest.raises(exc):
                    c.execute(sql, prepare=prepare)
                assert c.execute("SELECT 'usable'").fetchone() == ("usable",)
        assert c.info.transaction_status == pq.TransactionStatus.IDLE


def test_drop(adsn: str) -> None:
    with psycopg.connect(adsn, autocommit=True) as c:
        with pytest.raises(errors.UndefinedObject, match="sketch 99 does not exist"):
            c.execute("IMP DROP SKETCH 99")
        cur = c.execute("IMP DROP SKETCH 1")
        assert cur.statusmessage == "IMP DROP SKETCH"
        assert c.execute("IMP SHOW SKETCHES").fetchall() == []
        assert c.execute("IMP DROP ALL SKETCHES").statusmessage == "IMP DROP 0"


def test_admin_in_a_pipeline_is_left_to_postgres(adsn: str) -> None:
    """Behind other in-flight messages the proxy cannot answer in order: PostgreSQL reports a
    syntax error, the session stays consistent."""
    with psycopg.connect(adsn, autocommit=True) as c:
        with pytest.raises(errors.SyntaxError), c.pipeline():
            c.execute("SELECT 1")
            c.execute("IMP SHOW STATS")
        assert c.execute("IMP SHOW STATS").fetchall()


def test_psql_admin(adsn: str) -> None:
    res = subprocess.run(["psql", "-X", "-d", adsn, "-c", "IMP SHOW SKETCHES", "-c",
                          f"IMP EXPLAIN {Q}", "-c", "imp show stats"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "sketch_id | template" in res.stdout and " decision " in res.stdout
    assert "proxy.admin_commands" in res.stdout


def test_without_library(proxy_dsn: str) -> None:
    with psycopg.connect(proxy_dsn, autocommit=True) as c:
        with pytest.raises(errors.UndefinedObject):
            c.execute("IMP SET strategy = eager")
        assert c.execute("IMP SHOW SKETCHES").fetchall() == []
        e = kv(c, "IMP EXPLAIN SELECT 1 GROUP BY 1")
        assert e["decision"] == "passthrough"
        assert kv(c, "IMP SHOW STATS")["library"] == "false"


@pytest.mark.parametrize("prepare", [False, True])
def test_shared_state_needs_a_superuser(db_dsn: str, start_proxy: StartProxy,
                                        prepare: bool) -> None:
    """Dropping sketches and process-wide settings change every session's proxy: a role
    without privileges gets PostgreSQL's 42501 (and learns no sketch id), a superuser may;
    ``IMP SET enabled`` is the session's own and open to every role."""
    own = start_proxy(hook=HOOK)
    role = f"nobody_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute(f"CREATE ROLE {role} LOGIN")
        c.execute("CREATE TABLE IF NOT EXISTS probe (id bigserial PRIMARY KEY, grp int NOT NULL)")
    su = via_proxy(db_dsn, own.port)
    with psycopg.connect(via_proxy(db_dsn, own.port, user=role), autocommit=True) as c:
        for sql in ("IMP DROP SKETCH 1", "IMP DROP SKETCH 99", "IMP DROP ALL SKETCHES",
                    "IMP SET strategy = eager", "IMP SET STRATEGY = eager FOR SKETCH 1"):
            with pytest.raises(errors.InsufficientPrivilege, match="permission denied to"):
                c.execute(sql, prepare=prepare)
            assert c.execute("SELECT 'usable'").fetchone() == ("usable",)
        with c.transaction():   # inside a transaction block too; it stays usable
            with pytest.raises(errors.InsufficientPrivilege):
                c.execute("IMP DROP ALL SKETCHES", prepare=prepare)
        assert c.execute("IMP SET enabled = off", prepare=prepare).statusmessage == "IMP SET"
        assert kv(c, "IMP SHOW STATS")["session.enabled"] == "false"
        assert c.info.transaction_status == pq.TransactionStatus.IDLE
    with psycopg.connect(su, autocommit=True) as c:
        assert [r[0] for r in c.execute("IMP SHOW SKETCHES").fetchall()] == ["1"]
        stats = kv(c, "IMP SHOW STATS")
        assert stats["hook.strategy"] == "lazy" and stats["session.enabled"] == "true"
        c.execute("IMP SET strategy = eager", prepare=prepare)
        assert kv(c, "IMP SHOW STATS")["hook.strategy"] == "eager"
        assert c.execute("IMP DROP SKETCH 1", prepare=prepare).statusmessage == \
            "IMP DROP SKETCH"
        assert c.execute("IMP DROP ALL SKETCHES", prepare=prepare).statusmessage == \
            "IMP DROP 0"
        # a superuser reached through SET ROLE of an unprivileged role is refused
        c.execute(f"SET ROLE {role}")
        with pytest.raises(errors.InsufficientPrivilege):
            c.execute("IMP SET strategy = lazy", prepare=prepare)
        c.execute("RESET ROLE")
        assert kv(c, "IMP SHOW STATS")["hook.strategy"] == "eager"


def test_repeated_library_settings_reach_a_database_used_afterwards(
        db_dsn: str, start_proxy: StartProxy, fresh_db: Callable[[], str]) -> None:
    """Each database has its own library hook, given the IMP SET library settings when first
    used: the latest value of each (they were replayed, one per IMP SET ever run)."""
    own = start_proxy(hook="sketches.manager:SketchManager")
    with psycopg.connect(via_proxy(db_dsn, own.port), autocommit=True) as c:
        for i in range(200):
            c.execute(f"IMP SET strategy = {('lazy', 'eager')[i % 2]}")
            c.execute(f"IMP SET batch_size = {1000 + i}")
        c.execute("IMP SET strategy = lazy")
        assert kv(c, "IMP SHOW STATS")["strategy"] == "lazy"
        c.execute("IMP SET strategy = eager")
    with psycopg.connect(via_proxy(fresh_db(), own.port), autocommit=True) as c:
        assert kv(c, "IMP SHOW STATS")["strategy"] == "eager"


# ---- against a role's own objects and odd input (a helper's search in session 24; each test
# failed on the code before)

def _new_role(db_dsn: str) -> str:
    role = f"evil_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute(f"CREATE ROLE {role} LOGIN")
        c.execute(f"GRANT CREATE ON DATABASE {c.info.dbname} TO {role}")
    return role


def test_a_statement_starting_with_imp_after_blanks_is_no_imp_statement(
        db_dsn: str, adsn: str) -> None:
    """``admin.is_admin`` looked at the first 16 bytes only: 13 blanks and ``imp`` ended the
    window, ``\\Z`` matched the end of the slice, and IMPORT FOREIGN SCHEMA was answered by
    the proxy (42601) instead of PostgreSQL (42704)."""
    sql = " " * 13 + "IMPORT FOREIGN SCHEMA public FROM SERVER nosuch INTO public"
    for dsn in (db_dsn, adsn):
        with psycopg.connect(dsn, autocommit=True) as c:
            with pytest.raises(errors.UndefinedObject, match='server "nosuch" does not exist'):
                c.execute(sql)


def test_a_sketch_id_in_other_digits_is_invalid(adsn: str) -> None:
    """``'²'.isdigit()`` is true but ``int('²')`` raises: the proxy answered XX000 with Python's
    message ("invalid literal for int()") instead of 22P02 invalid sketch id."""
    with psycopg.connect(adsn, autocommit=True) as c:
        for sql in ("IMP DROP SKETCH \u00b2", "IMP SET STRATEGY = eager FOR SKETCH \u00b2"):
            with pytest.raises(psycopg.Error) as ei:
                c.execute(sql)
            assert ei.value.sqlstate == "22P02", (sql, ei.value.sqlstate, str(ei.value))


def test_show_sketches_ignores_a_roles_own_privilege_function(
        db_dsn: str, adsn: str, start_proxy: StartProxy) -> None:
    """The readable-sketches filter (``intercept._READABLE``) called has_table_privilege and
    the rest unqualified: a role that may not read probe saw its sketch once its own schema,
    with a has_table_privilege() that says yes, preceded pg_catalog."""
    own = start_proxy(hook=HOOK)
    with psycopg.connect(via_proxy(db_dsn, own.port), autocommit=True) as c:
        c.execute(Q).fetchall()
        assert len(c.execute("IMP SHOW SKETCHES").fetchall()) == 1
    role = _new_role(db_dsn)
    with psycopg.connect(via_proxy(db_dsn, own.port, user=role), autocommit=True) as c:
        assert c.execute("IMP SHOW SKETCHES").fetchall() == []
        c.execute(f"CREATE SCHEMA {role}")
        c.execute(f"CREATE FUNCTION {role}.has_table_privilege(regclass, text) RETURNS boolean"
                  " LANGUAGE sql AS 'SELECT true'")
        c.execute(f"SET search_path = {role}, pg_catalog")
        assert c.execute("IMP SHOW SKETCHES").fetchall() == []


def test_the_superuser_check_ignores_a_roles_own_operator(
        db_dsn: str, adsn: str, start_proxy: StartProxy) -> None:
    """The superuser check (``intercept._SUPERUSER``) qualified pg_roles and current_user but
    not ``=``: a role's own ``=(name, name)`` returning true made the first pg_roles row (the
    bootstrap superuser) answer, and a role that is no superuser dropped every sketch."""
    own = start_proxy(hook=HOOK)
    with psycopg.connect(via_proxy(db_dsn, own.port), autocommit=True) as c:
        c.execute(Q).fetchall()
    role = _new_role(db_dsn)
    with psycopg.connect(via_proxy(db_dsn, own.port, user=role), autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {role}")
        c.execute(f"CREATE FUNCTION {role}.eq(name, name) RETURNS boolean"
                  " LANGUAGE sql AS 'SELECT true'")
        c.execute(f"CREATE OPERATOR {role}.= (leftarg = name, rightarg = name,"
                  f" function = {role}.eq)")
        c.execute(f"SET search_path = {role}, pg_catalog")
        with pytest.raises(errors.InsufficientPrivilege):
            c.execute("IMP DROP ALL SKETCHES")


def test_a_failing_check_leaves_the_clients_transaction_usable(
        db_dsn: str, adsn: str, start_proxy: StartProxy) -> None:
    """The read-privilege check runs on the client's backend inside its transaction: a table
    ``pg_class`` of the role's own before pg_catalog made it fail, and IMP SHOW SKETCHES
    answered (0 rows) over a transaction it had aborted (the next SELECT got 25P02). It is
    qualified now, and runs in a savepoint inside a transaction block."""
    own = start_proxy(hook=HOOK)
    dsn = via_proxy(db_dsn, own.port)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(Q).fetchall()
        c.execute("CREATE SCHEMA IF NOT EXISTS shadow")
        c.execute("CREATE TABLE IF NOT EXISTS shadow.pg_class (x int)")
    with psycopg.connect(dsn) as c:
        c.execute("SET search_path = shadow, pg_catalog, public")
        c.commit()
        c.execute("SELECT 1")
        c.execute("IMP SHOW SKETCHES").fetchall()
        assert c.info.transaction_status == pq.TransactionStatus.INTRANS
        assert c.execute("SELECT 2").fetchone() == (2,)


@pytest.mark.parametrize("formats", [(1, 0), (0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1)])
def test_a_bind_with_another_number_of_result_formats_fails_as_in_postgresql(
        adsn: str, formats: tuple[int, ...]) -> None:
    """More than one result format code, but not one per column: PostgreSQL's ``08P01 bind
    message has 2 result formats but query has N columns``, and the session goes on (found by
    a regression search in session 26: the Describe after such a Bind of an IMP statement
    raised IndexError in the proxy, which closed the connection without a word)."""
    info = psycopg.conninfo.conninfo_to_dict(adsn)
    c = RawClient("127.0.0.1", int(str(info["port"])))
    try:
        c.startup(str(info["user"]), str(info["dbname"]))
        c.send(codec.encode_parse("", "IMP SHOW SKETCHES")
               + codec.encode_bind(Bind("", "", (), (), formats)) + codec.encode_describe("P", "")
               + codec.encode_execute("") + codec.encode_sync()
               + codec.encode_query("SELECT 42"))
        first, then = c.until_ready(), c.until_ready()
    finally:
        c.close()
    errors_ = [codec.decode_error_fields(m) for t, m in first if t == ord("E")]
    assert [(e.sqlstate, e.message) for e in errors_] == [
        ("08P01", f"bind message has {len(formats)} result formats but query has "
                  f"{len(SKETCH_COLUMNS)} columns")]
    assert [codec.decode_data_row(m).values for t, m in then if t == ord("D")] == [(b"42",)]


def _trace(msgs: list[tuple[int, bytes]]) -> list[str]:
    """Message types, with CommandComplete tags and error codes and texts spelt out."""
    out = []
    for typ, msg in msgs:
        if typ == ord("C"):
            out.append("C " + codec.decode_command_complete(msg).tag)
        elif typ == ord("E"):
            e = codec.decode_error_fields(msg)
            out.append(f"E {e.sqlstate} {e.message}")
        else:
            out.append(chr(typ))
    return out


def _portal_runs(dsn: str, sql: str, rows_sql: str | None = None) -> list[list[str]]:
    """Bind ``sql`` to portal p and execute it with row limits, as pgjdbc's fetch size does,
    then once more; again in an explicit transaction across Syncs; then p after its
    transaction ended."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    c = RawClient("127.0.0.1", int(str(info["port"])))
    try:
        c.startup(str(info["user"]), str(info["dbname"]))
        run = (codec.encode_parse("", sql) + codec.encode_bind(Bind("p", "", (), (), ()))
               + codec.encode_execute("p", 2) + codec.encode_execute("p", 2)
               + codec.encode_execute("p", 0) + codec.encode_execute("p", 0)
               + codec.encode_sync())
        c.send(run)
        out = [_trace(c.until_ready())]
        c.send(codec.encode_execute("p", 0) + codec.encode_sync())   # gone with its txn
        out.append(_trace(c.until_ready()))
        c.send(codec.encode_query("BEGIN"))
        c.until_ready()
        c.send(codec.encode_parse("", sql) + codec.encode_bind(Bind("p", "", (), (), ()))
               + codec.encode_execute("p", 3) + codec.encode_sync())
        out.append(_trace(c.until_ready()))
        c.send(codec.encode_execute("p", 0) + codec.encode_sync())   # kept across the Sync
        out.append(_trace(c.until_ready()))
        c.send(codec.encode_query("COMMIT"))
        c.until_ready()
        c.send(codec.encode_execute("p", 0) + codec.encode_sync())
        out.append(_trace(c.until_ready()))
    finally:
        c.close()
    return out


def test_imp_portals_follow_row_limits_as_postgresql_portals_do(adsn: str,
                                                                db_dsn: str) -> None:
    """An IMP statement's portal executed with a row limit (``Execute(max_rows)``: pgjdbc's
    ``setFetchSize`` in a transaction) sends that many rows and PortalSuspended, the rest on
    the next Execute with ``SELECT n`` counting its own rows, and nothing more after that
    (``SELECT 0``); a statement without rows run twice fails with 55000; the portal is gone
    when its transaction ends. Each as PostgreSQL does for a SELECT of as many rows and for
    a SET (the proxy answered every Execute with every row, and ran the statement again)."""
    with psycopg.connect(adsn, autocommit=True) as c:
        rows = len(c.execute("IMP SHOW STATS").fetchall())
    assert rows > 5
    same_rows = f"SELECT * FROM generate_series(1, {rows})"
    assert _portal_runs(adsn, "IMP SHOW STATS") == _portal_runs(db_dsn, same_rows)
    no_rows = _portal_runs(adsn, "IMP SET enabled = on")
    assert no_rows == [[t.replace("SET", "IMP SET") if t == "C SET" else t for t in run]
                       for run in _portal_runs(db_dsn, "SET work_mem = '8MB'")]
    assert no_rows[0] == ["1", "2", "C IMP SET", 'E 55000 portal "p" cannot be run', "Z"]


def _script(dsn: str, steps: list[bytes]) -> list[list[str]]:
    """Each step sent on one raw connection and traced up to its ReadyForQuery."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    c = RawClient("127.0.0.1", int(str(info["port"])))
    try:
        c.startup(str(info["user"]), str(info["dbname"]))
        out = []
        for step in steps:
            c.send(step)
            msgs = c.until_ready()
            out.append(_trace(msgs) + [f"status {chr(msgs[-1][1][-1])}"])
        return out
    finally:
        c.close()


def _bind_execute(statement: str) -> bytes:
    return (codec.encode_bind(Bind("", statement, (), (), ())) + codec.encode_execute("", 0)
            + codec.encode_sync())


_P, _S, _Q = codec.encode_parse, codec.encode_sync(), codec.encode_query
STATEMENT_LIVES = {
    "a name parsed twice": lambda x: [_P("s", x) + _S, _P("s", x) + _S],
    "DEALLOCATE, then a Bind": lambda x: [_P("s", x) + _S, _Q("deallocate  prepare \"s\" ;"),
                                         _bind_execute("s")],
    "DEALLOCATE ALL, then a Bind": lambda x: [_P("s", x) + _S, _Q("DEALLOCATE ALL"),
                                             _bind_execute("s")],
    "DISCARD ALL, then a Bind": lambda x: [_P("s", x) + _S, _Q("DISCARD ALL"),
                                          _bind_execute("s")],
    "DISCARD ALL in a transaction": lambda x: [_P("s", x) + _S, _Q("BEGIN"), _Q("DISCARD ALL"),
                                              _Q("ROLLBACK"), _bind_execute("s")],
    "the unnamed one, after a Query": lambda x: [_P("", x) + _S, _Q("SELECT 1"),
                                                _bind_execute("")],
    "DEALLOCATE in a failed transaction": lambda x: [_P("s", x) + _S, _Q("BEGIN"),
                                                    _Q("SELECT 1/0"), _Q("DEALLOCATE s"),
                                                    _Q("ROLLBACK"), _bind_execute("s")],
    "the client's statement, then its name": lambda x: [_P("s", "SELECT 1") + _S, _P("s", x)
                                                        + _S, _bind_execute("s")],
    "its name, then the client's statement": lambda x: [_P("s", x) + _S, _P("s", "SELECT 1")
                                                        + _bind_execute("s"),
                                                        _bind_execute("s")],
    "a Parse in a failed transaction": lambda x: [_Q("BEGIN"), _Q("SELECT 1/0"), _P("s", x)
                                                 + _S, _Q("ROLLBACK"), _bind_execute("s")],
    "a name parsed twice in a failed transaction": lambda x: [_P("s", x) + _S, _Q("BEGIN"),
                                                             _Q("SELECT 1/0"), _P("s", x) + _S,
                                                             _Q("ROLLBACK")],
}


@pytest.mark.parametrize("case", sorted(STATEMENT_LIVES))
def test_a_prepared_imp_statement_lives_and_ends_as_postgresqls_own(adsn: str, db_dsn: str,
                                                                    case: str) -> None:
    """A named IMP statement parsed again fails with 42P05; SQL ``DEALLOCATE`` of it,
    ``DEALLOCATE ALL``, ``DISCARD ALL`` and (for the unnamed one) any Query end it, so a
    Bind then fails with 26000 — each exactly as for a SET prepared on PostgreSQL (found by
    a helper's search: the proxy kept them, and refused ``DEALLOCATE s`` with 26000). The
    name of a statement of the client's own is refused too, either way round, and a Parse in
    a failed transaction fails with 25P02 (found by the regression search after it: the IMP
    statement replaced the client's, whose Binds then ran it)."""
    got = _script(adsn, STATEMENT_LIVES[case]("IMP SET enabled = on"))
    want = _script(db_dsn, STATEMENT_LIVES[case]("SET work_mem = '4MB'"))
    assert [["C SET" if t == "C IMP SET" else t for t in step] for step in got] == want


def test_psycopg_evicting_a_prepared_imp_statement_from_its_cache(adsn: str) -> None:
    """psycopg with a libpq before 17 (PSYCOPG_IMPL=python on Debian 12's libpq 15) drops a
    statement evicted from its cache with SQL ``DEALLOCATE``; for an IMP statement that
    reached PostgreSQL, and the app's next, unrelated query raised 26000."""
    script = ("import sys, psycopg\n"
              "c = psycopg.connect(sys.argv[1], autocommit=True)\n"
              "assert psycopg.pq.version() < 170000, psycopg.pq.version()\n"
              "c.prepared_max = 1\n"
              "c.execute('IMP SHOW STATS', prepare=True).fetchall()\n"
              "c.execute('SELECT 1', prepare=True).fetchall()\n"
              "print(c.execute('SELECT 2', prepare=True).fetchall())\n")
    res = subprocess.run([sys.executable, "-c", script, adsn], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PSYCOPG_IMPL": "python"})
    assert res.returncode == 0 and "[(2,)]" in res.stdout, res.stderr[-800:]


def test_comments_stand_where_blanks_may_in_an_imp_statement(adsn: str) -> None:
    """psql sends a comment that follows the statement on its line (``IMP SHOW STATS -- x``
    with the ``;`` on the next line), and a comment may stand wherever a blank may; both were
    syntax errors. An unterminated quote is PostgreSQL's scanner error (it was accepted)."""
    for text in ("IMP SHOW STATS -- x", "IMP SHOW STATS /* x */", "IMP /* a /* b */ */ SHOW"
                 " -- c\n STATS;", "-- first\nIMP SHOW STATS"):
        assert parse_admin(text).kind == "show_stats", text
    assert parse_admin("IMP EXPLAIN SELECT 1 -- c").argument == "SELECT 1 -- c"
    assert parse_admin("IMP SET enabled = 'off' -- why").value == "off"
    # only the comments go (the first version of this rejoined tokens: ``- 5``, 42601)
    assert parse_admin("IMP SET fragments=-5 -- c").value == "-5"
    with pytest.raises(AdminError) as ei:
        parse_admin("IMP DROP SKETCH -1")
    assert ei.value.sqlstate == "22P02"
    with pytest.raises(AdminError) as ei:
        parse_admin("IMP SET enabled = 'off")
    assert (ei.value.sqlstate, ei.value.message) == (
        "42601", "unterminated quoted string at or near \"'off\"")
    with psycopg.connect(adsn, autocommit=True) as c:
        assert dict(c.execute("IMP SHOW STATS -- x\n").fetchall())["session.enabled"] == "true"


def test_imp_set_enabled_to_default_is_the_proxys_own_setting(adsn: str) -> None:
    """``SET … TO DEFAULT`` as PostgreSQL has it (it was refused with 22023)."""
    with psycopg.connect(adsn, autocommit=True) as c:
        c.execute("IMP SET enabled = off")
        assert dict(c.execute("IMP SHOW STATS").fetchall())["session.enabled"] == "false"
        c.execute("IMP SET enabled TO DEFAULT")
        assert dict(c.execute("IMP SHOW STATS").fetchall())["session.enabled"] == "true"
