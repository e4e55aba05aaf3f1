"""The IMP command surface against a role's own objects and odd input (found by a helper's
search in session 24; each test failed on the code before): a statement that is no IMP
statement is never taken for one, the superuser check and the readable-sketches filter run
on the client's search_path with every name qualified, a failing check leaves the client's
transaction as it was, and sketch ids are ASCII digits."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import errors, pq

from .conftest import ProxyProcess, StartProxy, via_proxy

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
