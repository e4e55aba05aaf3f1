"""Relay behaviour at the byte level: negotiation, TLS, authentication, cancel keys, malformed
frames, clients that vanish or terminate."""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from imp_proxy.embedded import LocalPostgres
from imp_proxy.protocol import codec
from imp_proxy.protocol.messages import Bind

from .conftest import ProxyProcess, StartProxy, via_proxy
from .rawclient import RawClient

SSL, GSSENC = 80877103, 80877104


def _db(dsn: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])


def _wait_backend_gone(admin_dsn: str, app: str, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        while time.monotonic() < deadline:
            n = c.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                          (app,)).fetchone()
            if n == (0,):
                return True
            time.sleep(0.05)
    return False


def _backend_count(admin_dsn: str, app: str) -> int:
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        row = c.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                        (app,)).fetchone()
    assert row is not None
    return int(row[0])


def test_ssl_and_gssenc_requests_answered_n_repeatedly(proxy: ProxyProcess, db_dsn: str) -> None:
    c = RawClient("127.0.0.1", proxy.port)
    try:
        assert c.negotiate(GSSENC) == b"N"
        assert c.negotiate(SSL) == b"N"
        assert c.negotiate(SSL) == b"N"
        assert c.negotiate(GSSENC) == b"N"
        msgs = c.startup("postgres", _db(db_dsn))
        assert msgs[-1] == (ord("Z"), b"Z\x00\x00\x00\x05I")
        c.send(codec.encode_query("SELECT 41 + 1"))
        replies = c.until_ready()
        assert codec.decode_data_row(replies[1][1]).values == (b"42",)
    finally:
        c.close()
    # libpq's sslmode=prefer falls back to plain text; require fails cleanly
    with psycopg.connect(via_proxy(db_dsn, proxy.port, sslmode="prefer")) as conn:
        assert conn.pgconn.ssl_in_use is False
    with pytest.raises(psycopg.OperationalError, match="SSL"):
        psycopg.connect(via_proxy(db_dsn, proxy.port, sslmode="require"))


def test_cancel_key_is_mapped(proxy: ProxyProcess, db_dsn: str) -> None:
    """The client gets the proxy's own secret: sent straight to PostgreSQL it cancels nothing,
    sent to the proxy it is mapped to the upstream backend's key and cancels the query."""
    c = RawClient("127.0.0.1", proxy.port)
    try:
        c.startup("postgres", _db(db_dsn))
        assert c.key is not None
        pid, secret = c.key
        c.send(codec.encode_query("SELECT pg_sleep(30)"))
        info = psycopg.conninfo.conninfo_to_dict(db_dsn)
        upstream = (str(info["host"]), int(str(info["port"])))
        for target in (upstream, ("127.0.0.1", proxy.port)):
            with socket.create_connection(target) as s:
                s.sendall(struct.pack("!iiii", 16, 80877102, pid, secret))
                s.recv(1)
            if target == upstream:
                assert not c.readable(1.0), "the proxy's key must not cancel directly"
        t0 = time.monotonic()
        replies = c.until_ready()
        assert time.monotonic() - t0 < 10
        err = [codec.decode_error_fields(m) for t, m in replies if t == ord("E")]
        assert err and err[0].sqlstate == "57014"
        assert replies[-1][1] == b"Z\x00\x00\x00\x05I"
    finally:
        c.close()


def test_a_cancel_has_reached_postgresql_when_its_connection_closes(proxy: ProxyProcess,
                                                                  db_dsn: str) -> None:
    """libpq's cancel returns once the server closes the cancel connection, which PostgreSQL
    does after signalling the backend: a cancel of an idle session is ignored, and the query
    sent next runs. Found with psycopg2 by a helper's search of other drivers: the proxy
    closed the cancel connection before it forwarded the cancel, which then aborted the
    client's next query (5 to 7 of 30 through the proxy, none directly)."""
    info = psycopg.conninfo.conninfo_to_dict(db_dsn)
    cancelled = []
    for target in ((str(info["host"]), int(str(info["port"]))), ("127.0.0.1", proxy.port)):
        c = RawClient(*target)
        try:
            c.startup("postgres", _db(db_dsn))
            assert c.key is not None
            hits = 0
            for _ in range(20):
                with socket.create_connection(target) as s:
                    s.sendall(struct.pack("!iiii", 16, 80877102, *c.key))
                    assert s.recv(1) == b""   # closed: the cancel was processed
                c.send(codec.encode_query("SELECT pg_sleep(0.05)"))
                replies = c.until_ready()
                hits += any(t == ord("E") for t, _m in replies)
            cancelled.append(hits)
        finally:
            c.close()
    assert cancelled == [0, 0]


def test_malformed_frame_gets_fatal_and_only_that_client_is_dropped(proxy: ProxyProcess,
                                                                    db_dsn: str) -> None:
    good = RawClient("127.0.0.1", proxy.port)
    bad = RawClient("127.0.0.1", proxy.port)
    try:
        good.startup("postgres", _db(db_dsn))
        bad.startup("postgres", _db(db_dsn))
        bad.send(b"Q\x00\x00\x00\x02")  # a length below 4 is impossible
        msg = bad.read()
        assert msg is not None and msg[0] == ord("E")
        err = codec.decode_error_fields(msg[1])
        assert (err.severity, err.sqlstate) == ("FATAL", "08P01") and err.message
        assert bad.read() is None  # closed
        good.send(codec.encode_query("SELECT 'fine'"))
        assert codec.decode_data_row(good.until_ready()[1][1]).values == (b"fine",)
    finally:
        good.close()
        bad.close()


def test_malformed_startup_packet(proxy: ProxyProcess) -> None:
    c = RawClient("127.0.0.1", proxy.port)
    try:
        c.send(b"\x00\x00\x00\x04")
        c.send(b"\x00\x00\x00\x00")
        msg = c.read()
        assert msg is not None and msg[0] == ord("E")
        err = codec.decode_error_fields(msg[1])
        assert err.severity == "FATAL" and err.sqlstate == "08P01"
        assert c.read() is None
    finally:
        c.close()


def test_message_size_limit(start_proxy: StartProxy, db_dsn: str) -> None:
    small = start_proxy("--max-message-size", "4096")
    c = RawClient("127.0.0.1", small.port)
    try:
        c.startup("postgres", _db(db_dsn))
        c.send(codec.encode_query("SELECT '" + "x" * 100 + "'"))
        assert c.until_ready()[-1][0] == ord("Z")
        c.send(codec.encode_query("SELECT '" + "x" * 5000 + "'"))
        msg = c.read()
        assert msg is not None
        err = codec.decode_error_fields(msg[1])
        assert (err.severity, err.sqlstate) == ("FATAL", "08P01")
        assert "length" in err.message
    finally:
        c.close()


@pytest.mark.parametrize("query", ["SELECT generate_series(1, 100000000)",
                                   "SELECT pg_sleep(60)"])
def test_client_vanishing_mid_query_ends_backend(proxy: ProxyProcess, db_dsn: str,
                                                 admin_dsn: str, query: str) -> None:
    app = f"vanish-{abs(hash(query)) % 10000}"
    c = RawClient("127.0.0.1", proxy.port)
    c.startup("postgres", _db(db_dsn), application_name=app)
    c.send(codec.encode_query(query))
    if "generate_series" in query:
        assert c.readable(30)
        c.sock.recv(1000)  # the result has started streaming
    else:
        time.sleep(0.3)  # let the query start
    assert _backend_count(admin_dsn, app) == 1
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()  # RST, no Terminate
    assert _wait_backend_gone(admin_dsn, app)


def test_terminate_closes_backend(proxy: ProxyProcess, db_dsn: str, admin_dsn: str) -> None:
    c = RawClient("127.0.0.1", proxy.port)
    c.startup("postgres", _db(db_dsn), application_name="imp-terminate")
    assert _backend_count(admin_dsn, "imp-terminate") == 1
    c.send(codec.encode_terminate())
    assert c.read() is None
    c.close()
    assert _wait_backend_gone(admin_dsn, "imp-terminate")


_BEFORE_TERMINATE = {
    "query": codec.encode_query("SELECT 1"),
    "slow query": codec.encode_query("SELECT pg_sleep(0.2), 1"),
    "extended, Sync": (codec.encode_parse("", "SELECT 1")
                       + codec.encode_bind(Bind("", "", (), (), ())) + codec.encode_execute("")
                       + codec.encode_sync()),
    "extended, Flush": (codec.encode_parse("", "SELECT 1")
                        + codec.encode_bind(Bind("", "", (), (), ())) + codec.encode_execute("")
                        + codec.encode_flush()),
    "sketchable query": codec.encode_query("SELECT g, count(*) FROM relay_t GROUP BY g"
                                           " HAVING count(*) > 1 ORDER BY g"),
}


@pytest.fixture(scope="module")
def sketching_proxy(start_proxy: StartProxy) -> ProxyProcess:
    return start_proxy(sketches=True)


def _until_closed(port: int, db: str, payload: bytes) -> list[tuple[int, bytes]]:
    c = RawClient("127.0.0.1", port)
    try:
        c.startup("postgres", db)
        c.send(payload)
        msgs = []
        while (m := c.read()) is not None:
            msgs.append(m)
        return msgs
    finally:
        c.close()


@pytest.fixture(scope="module")
def relay_t(db_dsn: str) -> str:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE relay_t AS SELECT i % 7 AS g FROM generate_series(1, 100) i")
    return db_dsn


@pytest.mark.parametrize("name", sorted(_BEFORE_TERMINATE))
def test_replies_to_messages_before_a_terminate_reach_the_client(
        proxy: ProxyProcess, sketching_proxy: ProxyProcess, relay_t: str, name: str) -> None:
    """PostgreSQL answers what came before a Terminate in the same write, then closes (found
    by a helper's search in session 26: the proxy closed the client at once, no reply)."""
    payload = _BEFORE_TERMINATE[name] + codec.encode_terminate()
    port = int(str(psycopg.conninfo.conninfo_to_dict(relay_t)["port"]))
    want = _until_closed(port, _db(relay_t), payload)
    assert want and (want[-1][0] == ord("Z") or name.endswith("Flush"))
    for p in (proxy, sketching_proxy):
        assert _until_closed(p.port, _db(relay_t), payload) == want


def test_a_statement_sent_with_its_terminate_still_runs(proxy: ProxyProcess,
                                                        db_dsn: str) -> None:
    """Even when the client closes at once: the proxy cancels nothing, as PostgreSQL reads
    the Terminate only after the statement."""
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE relay_fired (who text)")
        raw = RawClient("127.0.0.1", proxy.port)
        raw.startup("postgres", _db(db_dsn))
        raw.send(codec.encode_query("INSERT INTO relay_fired SELECT 'proxy' FROM pg_sleep(0.3)")
                 + codec.encode_terminate())
        raw.close()
        deadline = time.monotonic() + 15
        while c.execute("SELECT who FROM relay_fired").fetchall() != [("proxy",)]:
            assert time.monotonic() < deadline, "the INSERT never committed"
            time.sleep(0.05)


# ---------------------------------------------------------------- TLS termination

@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "server.crt", d / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def test_tls_termination(start_proxy: StartProxy, tls_files: tuple[Path, Path],
                         db_dsn: str) -> None:
    cert, key = tls_files
    p = start_proxy("--tls-cert", str(cert), "--tls-key", str(key))
    with psycopg.connect(via_proxy(db_dsn, p.port, sslmode="require")) as conn:
        assert conn.pgconn.ssl_in_use is True
        assert conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
                            ).fetchone() == (False,)  # the upstream leg is plain
        assert conn.execute("SELECT %s::text || 'ok'", ("tls-",)).fetchone() == ("tls-ok",)
    with psycopg.connect(via_proxy(db_dsn, p.port, sslmode="verify-full",
                                   sslrootcert=str(cert), host="localhost")) as conn:
        assert conn.pgconn.ssl_in_use is True
    with psycopg.connect(via_proxy(db_dsn, p.port, sslmode="disable")) as conn:
        assert conn.pgconn.ssl_in_use is False
    # GSSENCRequest first, then SSLRequest: 'N' then 'S'
    c = RawClient("127.0.0.1", p.port)
    try:
        assert c.negotiate(GSSENC) == b"N"
        assert c.negotiate(SSL) == b"S"
    finally:
        c.close()


# ---------------------------------------------------------------- authentication relay

@pytest.fixture(scope="module")
def auth_cluster() -> Iterator[LocalPostgres]:
    hba = ("local all all trust\n"
           "host all postgres 127.0.0.1/32 trust\n"
           "host all md5user 127.0.0.1/32 md5\n"
           "host all scramuser 127.0.0.1/32 scram-sha-256\n")
    pg = LocalPostgres.throwaway_cluster(hba=hba)
    pg.start()
    try:
        with psycopg.connect(pg.dsn(), autocommit=True) as c:
            c.execute("SET password_encryption = 'md5'")
            c.execute("CREATE ROLE md5user LOGIN PASSWORD 'md5-secret'")
            c.execute("SET password_encryption = 'scram-sha-256'")
            c.execute("CREATE ROLE scramuser LOGIN PASSWORD 'scram-secret'")
        yield pg
    finally:
        pg.destroy()


@pytest.mark.parametrize(("user", "password", "method"),
                         [("md5user", "md5-secret", "md5"),
                          ("scramuser", "scram-secret", "scram-sha-256")])
def test_password_authentication_relayed(start_proxy: StartProxy, auth_cluster: LocalPostgres,
                                         user: str, password: str, method: str) -> None:
    p = start_proxy(upstream=auth_cluster.dsn())
    dsn = f"host=127.0.0.1 port={p.port} dbname=postgres user={user}"
    with psycopg.connect(dsn, password=password,
                         require_auth=method) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (user,)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(dsn, password="wrong")


# ---------------------------------------------------------------- byte-identical replies

def _script_replies(port: int, dbname: str) -> list[bytes]:
    """Runs a fixed extended/simple protocol script; returns every reply message after
    startup (their bytes)."""
    c = RawClient("127.0.0.1", port)
    out: list[bytes] = []
    try:
        c.startup("postgres", dbname, application_name="script")

        def rt(payload: bytes, until: int = ord("Z")) -> None:
            c.send(payload)
            while True:
                m = c.read()
                assert m is not None
                out.append(m[1])
                if m[0] == until:
                    return

        rt(codec.encode_query("SET application_name = 'x'; SELECT count(*) FROM s;"))
        # named statement, Describe S/P, Execute with max_rows -> PortalSuspended, Flush
        rt(codec.encode_query("BEGIN"))
        rt(codec.encode_parse("st", "SELECT a, a * $1 FROM s ORDER BY a", [23])
           + codec.encode_describe("S", "st")
           + codec.encode_bind(Bind("p1", "st", (0,), (b"3",), (0, 1)))
           + codec.encode_describe("P", "p1")
           + codec.encode_execute("p1", 3) + codec.encode_flush(), until=ord("s"))
        rt(codec.encode_execute("p1", 3) + codec.encode_flush(), until=ord("s"))
        rt(codec.encode_execute("p1", 3) + codec.encode_close("P", "p1")
           + codec.encode_sync())
        rt(codec.encode_query("COMMIT"))
        # an error mid-batch: everything up to Sync is discarded by the server
        rt(codec.encode_parse("", "SELECT 1/0") + codec.encode_bind(Bind("", "", (), (), ()))
           + codec.encode_execute("", 0)
           + codec.encode_parse("", "SELECT 2") + codec.encode_bind(Bind("", "", (), (), ()))
           + codec.encode_execute("", 0) + codec.encode_sync())
        # empty query (simple and extended), notice, re-use of the named statement, Close
        rt(codec.encode_query(""))
        rt(codec.encode_parse("", "") + codec.encode_bind(Bind("", "", (), (), ()))
           + codec.encode_execute("", 0) + codec.encode_sync())
        rt(codec.encode_query("DO $$ BEGIN RAISE NOTICE 'n1'; END $$"))
        rt(codec.encode_bind(Bind("", "st", (1,), (b"\x00\x00\x00\x02",), ()))
           + codec.encode_execute("", 0) + codec.encode_close("S", "st") + codec.encode_sync())
        rt(codec.encode_query("SELECT 'é', NULL::int, 1.5::float8; SELECT 1 WHERE false"))
    finally:
        c.close()
    return out


def test_replies_byte_identical_to_direct(proxy: ProxyProcess, db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE s (a int)")
        conn.execute("INSERT INTO s SELECT generate_series(1, 7)")
    info = psycopg.conninfo.conninfo_to_dict(db_dsn)
    direct = _script_replies(int(str(info["port"])), _db(db_dsn))
    proxied = _script_replies(proxy.port, _db(db_dsn))
    assert proxied == direct
    kinds = bytes(m[0] for m in proxied)
    assert b"s" in kinds and b"I" in kinds and b"N" in kinds and b"3" in kinds


def test_service_connection_failure_falls_back_fast(start_proxy: StartProxy,
                                                    auth_cluster: LocalPostgres) -> None:
    """The proxy's own service connections use the upstream DSN's credentials; when they are
    refused, sketchable queries still answer (original SQL), and after the first failure the
    database is skipped at once instead of waiting for the pool timeout each time."""
    with psycopg.connect(auth_cluster.dsn(), autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS probe (id bigserial PRIMARY KEY, grp int)")
        c.execute("GRANT SELECT ON probe TO md5user")
        c.execute("INSERT INTO probe (grp) VALUES (1), (1), (2)")
    p = start_proxy("--connect-timeout", "2",
                    upstream=f"postgresql://md5user@127.0.0.1:{auth_cluster.port}/postgres",
                    hook="tests.imp_proxy.hooks:create_hook")
    dsn = f"host=127.0.0.1 port={p.port} dbname=postgres user=md5user password=md5-secret"
    q = "SELECT grp, count(*) FROM probe GROUP BY grp ORDER BY grp"
    with psycopg.connect(dsn, autocommit=True) as c:
        assert c.execute(q).fetchall() == [(1, 2), (2, 1)]
        t0 = time.monotonic()
        assert c.execute(q).fetchall() == [(1, 2), (2, 1)]
        assert time.monotonic() - t0 < 1.0
        s = dict(c.execute("IMP SHOW STATS").fetchall())
    assert s["proxy.fallbacks"] == "2" and s["proxy.wrapped"] == "0"
