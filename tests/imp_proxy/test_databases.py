"""Statements that need a database to themselves, through a proxy that holds sessions there
(service pool, eager maintenance): they run as they do directly (``imp_proxy.databases``)."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from imp_proxy.databases import databases_named, mentions_database

from .conftest import ProxyProcess, StartProxy, via_proxy
from .test_sketch_manager import rounds_until_used, stats

QUERY = "SELECT g, sum(v) FROM dd GROUP BY g HAVING sum(v) > 60000 ORDER BY g"


@pytest.mark.parametrize(("text", "names"), [
    (b'DROP DATABASE IF EXISTS "Foo" WITH (FORCE)', {"Foo"}),
    (b"  -- why\n/* c */ alter database a RENAME TO b", {"a"}),
    (b"CREATE DATABASE c TEMPLATE d", {"d"}),
    (b"create database c", {"template1"}),
    (b"CREATE DATABASE c TEMPLATE DEFAULT", {"template1"}),
    (b"ALTER DATABASE a SET TABLESPACE t", {"a"}),
    (b"ALTER DATABASE a SET work_mem = '1MB'", set()),
    (b"ALTER DATABASE a OWNER TO r", set()),
    (b"CREATE TABLE database (a int)", set()),
    (b"SELECT 'drop database x'", set()),
    (b"DROP DATABASE", set()),   # a syntax error: PostgreSQL reports it
    (b"DROP DATABASE a; DROP DATABASE b", {"a", "b"}),
])
def test_the_databases_a_statement_needs_to_itself(text: bytes, names: set[str]) -> None:
    assert databases_named(text) == names


@pytest.mark.parametrize(("text", "look"), [
    (b"SELECT abalance FROM pgbench_accounts WHERE aid = 1;", False),
    (b"SELECT 1; ALTER DATABASE a RENAME TO b", True),
    (b"BEGIN; alter database a rename to b; COMMIT", True),
    (b"Drop Database a", True),
    (b"", False),
])
def test_which_query_texts_are_looked_at(text: bytes, look: bool) -> None:
    assert mentions_database(text) is look
    assert mentions_database(b"Q\0\0\0\0" + text + b"\0", 5, 5 + len(text)) is look


@pytest.fixture(scope="module")
def eager_proxy(start_proxy: StartProxy) -> ProxyProcess:
    return start_proxy(hook="sketches.manager:SketchManager")


@pytest.fixture
def served_db(admin_dsn: str, eager_proxy: ProxyProcess) -> Iterator[str]:
    """A database the proxy has sketched a query in, with eager maintenance (so its pool and
    its background thread hold sessions there); yields its name, dropped at the end."""
    name = f"dd_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=name)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE dd (id int PRIMARY KEY, g int NOT NULL, v int NOT NULL)")
        c.execute("INSERT INTO dd SELECT i, i % 40, i % 997 FROM generate_series(1, 8000) i")
        c.execute("ANALYZE dd")
    with psycopg.connect(via_proxy(dsn, eager_proxy.port), autocommit=True) as p:
        p.execute("IMP SET strategy = eager")
        rounds_until_used(p, lambda: _same(p, dsn))
        with psycopg.connect(dsn, autocommit=True) as c:   # the background thread maintains
            c.execute("UPDATE dd SET v = v + 1 WHERE id % 7 = 0")
        _same(p, dsn)
    try:
        yield name
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as c:
            for n in (name, f"{name}_r", f"{name}_c"):
                c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(n)))


def _same(proxied: psycopg.Connection[Any], direct_dsn: str) -> None:
    with psycopg.connect(direct_dsn) as d:
        assert proxied.execute(QUERY).fetchall() == d.execute(QUERY).fetchall()


def _sessions(admin_dsn: str, name: str) -> int:
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        row = c.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                        (name,)).fetchone()
    assert row is not None
    return int(row[0])


def test_rename_copy_and_drop_a_database_the_proxy_served(
        admin_dsn: str, eager_proxy: ProxyProcess, served_db: str) -> None:
    """Renamed (extended protocol), copied as a template (psql, simple protocol), then
    dropped by ``dropdb`` — all through the proxy, as directly."""
    name = served_db
    assert _sessions(admin_dsn, name) >= 2   # else this test shows nothing
    proxied_admin = via_proxy(admin_dsn, eager_proxy.port)
    with psycopg.connect(proxied_admin, autocommit=True) as p:
        p.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
            sql.Identifier(name), sql.Identifier(f"{name}_r")))
        assert int(stats(p)["proxy.databases_released"]) >= 1
    renamed = psycopg.conninfo.make_conninfo(admin_dsn, dbname=f"{name}_r")
    with psycopg.connect(via_proxy(renamed, eager_proxy.port), autocommit=True) as p:
        rounds_until_used(p, lambda: _same(p, renamed))
    copy = subprocess.run(["psql", "-X", "-v", "ON_ERROR_STOP=1", "-d", proxied_admin, "-c",
                           f'CREATE DATABASE "{name}_c" TEMPLATE "{name}_r"'],
                          capture_output=True, text=True, timeout=60)
    assert copy.returncode == 0, copy.stderr
    for db in (f"{name}_r", f"{name}_c"):
        dropped = subprocess.run(["dropdb", f"--maintenance-db={proxied_admin}", db],
                                 capture_output=True, text=True, timeout=60)
        assert dropped.returncode == 0, dropped.stderr
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        left = c.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                         (f"{name}%",)).fetchall()
    assert left == []


def test_a_client_of_its_own_still_gets_postgresqls_refusal(
        admin_dsn: str, eager_proxy: ProxyProcess, served_db: str) -> None:
    """The proxy lets go of its own sessions only: with a client still connected through the
    proxy, DROP DATABASE fails with PostgreSQL's own error, the same as with one client
    connected directly to a database the proxy never served, and the client keeps working."""
    served = served_db
    unserved = f"{served}_c"
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(unserved)))
    errors = []
    for name, client_via, admin_via in ((unserved, None, None),
                                        (served, eager_proxy.port, eager_proxy.port)):
        dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=name)
        client_dsn = dsn if client_via is None else via_proxy(dsn, client_via)
        admin = admin_dsn if admin_via is None else via_proxy(admin_dsn, admin_via)
        with psycopg.connect(client_dsn, autocommit=True) as client, \
                psycopg.connect(admin, autocommit=True) as a:
            with pytest.raises(psycopg.errors.ObjectInUse) as err:
                a.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(name)))
            diag = err.value.diag
            errors.append((str(diag.message_primary).replace(name, "?"), diag.message_detail))
            if client_via is not None:
                _same(client, dsn)
    assert errors[0] == errors[1]


def _rename_same_as_directly(admin_dsn: str, proxy: ProxyProcess, served: str,
                             run: Any) -> None:
    """``run(dsn, statement)`` renames a database the proxy served, through the proxy, and a
    database with no session, directly: both succeed (a rename may run in a transaction
    block, so in a multi-statement Query or after other statements of a pipeline)."""
    unserved = f"{served}_c"
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(unserved)))
    for dsn, name in ((admin_dsn, unserved), (via_proxy(admin_dsn, proxy.port), served)):
        run(dsn, sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
            sql.Identifier(name), sql.Identifier(name + "_x")).as_string(None))
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        for name in (served, unserved):
            c.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(
                sql.Identifier(name + "_x")))


@pytest.mark.parametrize("form", ["SELECT 1; {}", "BEGIN; {}; COMMIT", "; {}"])
def test_a_rename_in_a_multi_statement_query(admin_dsn: str, eager_proxy: ProxyProcess,
                                             served_db: str, form: str) -> None:
    def run(dsn: str, stmt: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(form.format(stmt).encode())   # no parameters: one simple Query

    _rename_same_as_directly(admin_dsn, eager_proxy, served_db, run)


def test_a_rename_after_other_statements_of_a_pipeline(admin_dsn: str,
                                                       eager_proxy: ProxyProcess,
                                                       served_db: str) -> None:
    def run(dsn: str, stmt: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as c, c.pipeline():
            c.execute("SELECT 1")
            c.execute(stmt.encode())

    _rename_same_as_directly(admin_dsn, eager_proxy, served_db, run)
