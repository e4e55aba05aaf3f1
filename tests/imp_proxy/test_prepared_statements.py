"""The client's prepared statements across the proxy's extended-protocol wrapping: the same
client messages, sent through the proxy and directly to PostgreSQL, get the same replies.

Found: the proxy's own BEGIN/COMMIT/ROLLBACK as simple Queries dropped the client's unnamed
statement; its statement names collided with a client's; and a Bind without a Parse was
wrapped with the SQL of a Parse the proxy had seen, where PostgreSQL's statement held other
SQL (a failed or skipped Parse) or none (DEALLOCATE, DISCARD ALL, a simple Query)."""

from __future__ import annotations

import itertools
import socket
import time

import psycopg
import pytest

import pg_extensions
from imp_proxy.protocol import codec
from imp_proxy.protocol.messages import Bind
from imp_proxy.session import MAX_STATEMENT_CHARS, MAX_STATEMENT_RECORDS

from .conftest import StartProxy, via_proxy
from .rawclient import RawClient
from .test_sketch_manager import (  # noqa: F401  (fixtures)
    ldsn,
    library_proxy,
    rounds_until_used,
    stats,
)

pytest.importorskip("sketches.manager")

Q = "SELECT g, sum(v) AS s, count(*) AS c FROM ps GROUP BY g HAVING count(*) > 150 ORDER BY g"
Q_ALL = Q.replace("count(*) > 150", "count(*) > 50")
QP = Q.replace("count(*) > 150", "count(*) > $1")

Msgs = list[tuple[int, bytes]]
# client messages (a tuple: written in pieces, a pause between two), and how many
# ReadyForQuery they are answered by
Step = tuple[bytes | tuple[bytes, ...], int]

SYNC = codec.encode_sync()


def parse(name: str, sql: str, types: tuple[int, ...] = ()) -> bytes:
    return codec.encode_parse(name, sql, types)


def bind(stmt: str, params: tuple[bytes | None, ...] = ()) -> bytes:
    return codec.encode_bind(Bind("", stmt, (), params, ()))


def execute(max_rows: int = 0) -> bytes:
    return codec.encode_execute("", max_rows)


def describe(kind: str, name: str) -> bytes:
    return codec.encode_describe(kind, name)


def query(sql: str) -> bytes:
    return codec.encode_query(sql)


@pytest.fixture(scope="module")
def env(ldsn: str, db_dsn: str) -> tuple[str, str]:  # noqa: F811
    """(proxy DSN, direct DSN); a tracked table whose ``Q`` the proxy answers from a sketch."""
    with psycopg.connect(db_dsn, autocommit=True) as d, \
            psycopg.connect(ldsn, autocommit=True) as c:
        d.execute("CREATE TABLE ps (id int PRIMARY KEY, g int NOT NULL, v int NOT NULL)")
        d.execute("INSERT INTO ps SELECT i, i % 40, i * 7 % 1000 FROM generate_series(1, 4000) i")
        d.execute("INSERT INTO ps SELECT 10000 + i, 7, 1 FROM generate_series(1, 300) i")
        d.execute("ANALYZE ps")
        pg_extensions.install(d)
        d.execute("SELECT imp.track_table('ps'::regclass)")

        def one() -> None:
            assert c.execute(Q).fetchall() == d.execute(Q).fetchall()
        rounds_until_used(c, one)
    return ldsn, db_dsn


def _client(dsn: str) -> RawClient:
    p = psycopg.conninfo.conninfo_to_dict(dsn)
    c = RawClient(str(p.get("host", "127.0.0.1")), int(p.get("port", 5432)), timeout=30)
    c.startup(str(p.get("user", "postgres")), str(p["dbname"]))
    return c


PAUSE = 0.05
"""Between two pieces of a step: long enough for the proxy to read the first alone."""


def _until(c: RawClient, readies: int) -> Msgs:
    out: Msgs = []
    while readies:
        m = c.read()
        assert m is not None, "the server closed the connection"
        out.append(m)
        readies -= m[0] == ord("Z")
    return out


def _run(dsn: str, steps: list[Step]) -> list[Msgs]:
    """Each step's replies, on a new connection."""
    c = _client(dsn)
    try:
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        out = []
        for data, readies in steps:
            for i, piece in enumerate((data,) if isinstance(data, bytes) else data):
                if i:
                    time.sleep(PAUSE)
                c.send(piece)
            out.append(_until(c, readies))
        return out
    finally:
        c.close()


def _shown(replies: list[Msgs]) -> list[list[str]]:
    """Comparable: errors by SQLSTATE and message, other messages by their bytes."""
    def one(t: int, m: bytes) -> str:
        if t in (ord("E"), ord("N")):
            f = codec.decode_error_fields(m)
            return f"{chr(t)} {f.sqlstate} {f.message}"
        return f"{chr(t)} {m[5:]!r}"
    return [[one(t, m) for t, m in step] for step in replies]


def assert_same_stream(env: tuple[str, str], steps: list[Step],
                       counter: str = "proxy.wrapped") -> int:
    """Asserts that the proxy answers ``steps`` as PostgreSQL does; returns how much
    ``counter`` grew meanwhile."""
    proxy_dsn, direct_dsn = env
    direct = _shown(_run(direct_dsn, steps))
    with psycopg.connect(proxy_dsn, autocommit=True) as c:
        before = int(stats(c).get(counter, 0))
        proxied = _shown(_run(proxy_dsn, steps))
        grew = int(stats(c).get(counter, 0)) - before
    assert proxied == direct
    return grew


# ------------------------------------------------------------------ the unnamed statement

def test_unnamed_statement_survives_a_wrapped_bind(env: tuple[str, str]) -> None:
    """A Bind alone of the unnamed statement is not wrapped (its text cannot be checked);
    the statement is still there for a Describe and a Bind with a row limit after it."""
    assert_same_stream(env, [(parse("", Q) + SYNC, 1),
                             (bind("") + execute() + SYNC, 1),
                             (describe("S", "") + SYNC, 1),
                             (bind("") + execute(1) + SYNC, 1)])


def test_unnamed_statement_survives_a_wrapped_named_batch(env: tuple[str, str]) -> None:
    """The proxy's BEGIN and COMMIT of a wrapping go through the extended protocol with its
    own named statements: a simple Query would drop the client's unnamed statement."""
    used = assert_same_stream(env, [(parse("", Q_ALL) + SYNC, 1),
                                    (parse("w1", Q) + bind("w1") + execute() + SYNC, 1),
                                    (bind("") + execute(1) + SYNC, 1)], "proxy.used")
    assert used == 1


def test_describe_statement_in_a_wrapped_bind_batch(env: tuple[str, str]) -> None:
    assert_same_stream(env, [(parse("", Q) + SYNC, 1),
                             (bind("") + describe("S", "") + execute() + SYNC, 1)])


def test_fallback_after_snapshot_keeps_the_unnamed_statement(env: tuple[str, str]) -> None:
    """A float4 parameter cannot be decoded: the wrapping falls back after the snapshot (and
    rolls it back), then sends the client's batch; the unnamed statement is still there."""
    fallbacks = assert_same_stream(
        env, [(parse("", Q_ALL) + SYNC, 1),
              (parse("f1", QP, (700,)) + bind("f1", (b"150",)) + execute() + SYNC, 1),
              (bind("") + execute(1) + SYNC, 1),
              (parse("", QP, (700,)) + SYNC, 1),
              (bind("", (b"150",)) + execute() + SYNC, 1)], "proxy.fallbacks")
    assert fallbacks == 1


def test_simple_query_drops_the_unnamed_statement(env: tuple[str, str]) -> None:
    assert_same_stream(env, [(parse("", Q) + SYNC, 1),
                             (query("SELECT 1"), 1),
                             (bind("") + execute() + SYNC, 1)])


def _value(replies: Msgs, key: str) -> bytes | None:
    for t, m in replies:
        if t == ord("D"):
            row = codec.decode_data_row(m).values
            if row[0] == key.encode():
                return row[1]
    raise AssertionError(f"no {key} in {replies}")


def test_imp_explain_keeps_the_unnamed_statement(env: tuple[str, str]) -> None:
    """IMP EXPLAIN, answered by the proxy, runs the snapshot steps on the client's backend."""
    proxy_dsn, direct_dsn = env
    first, last = (parse("", Q) + SYNC, 1), (bind("") + execute(1) + SYNC, 1)
    explain = (parse("e", "IMP EXPLAIN " + Q) + bind("e") + execute() + SYNC, 1)
    proxied = _run(proxy_dsn, [first, explain, last])
    assert _value(proxied[1], "decision") in (b"use", b"capture")
    assert _shown([proxied[0], proxied[2]]) == _shown(_run(direct_dsn, [first, last]))


# ------------------------------------------------------------------ named statements

def test_client_statement_named_like_the_proxys_own(env: tuple[str, str]) -> None:
    assert_same_stream(env, [(parse("_imp_wrapped", "SELECT 42 AS x") + SYNC, 1),
                             (parse("", Q) + bind("") + describe("P", "") + execute() + SYNC,
                              1),
                             (bind("_imp_wrapped") + execute() + SYNC, 1)])


def test_failed_parse_of_an_existing_name_keeps_the_old_statement(env: tuple[str, str]
                                                                  ) -> None:
    """42P05: ``s1`` still holds ``Q``, not the ``Q_ALL`` of the failed Parse."""
    fallbacks = assert_same_stream(env, [(parse("s1", Q) + SYNC, 1),
                                         (parse("s1", Q_ALL) + SYNC, 1),
                                         (bind("s1") + execute() + SYNC, 1)], "proxy.fallbacks")
    assert fallbacks == 1


PREPARED = query("SELECT name, statement FROM pg_prepared_statements ORDER BY name")


@pytest.mark.parametrize("drop", ["DEALLOCATE s2", "DEALLOCATE ALL", "DISCARD ALL"])
def test_deallocated_statement_is_not_run(env: tuple[str, str], drop: str) -> None:
    """Also: the proxy's probe of the statement, which fails, leaves nothing in the
    session (found by a regression search: ``_imp_probe_…`` in pg_prepared_statements)."""
    assert_same_stream(env, [(parse("s2", Q) + SYNC, 1),
                             (query(drop), 1),
                             (bind("s2") + execute() + SYNC, 1),
                             (PREPARED, 1)])


@pytest.mark.parametrize("pad", [0, 60000], ids=["many", "long"])
def test_statements_dropped_by_sql_leave_a_bounded_record(env: tuple[str, str],
                                                          pad: int) -> None:
    """Statements Parsed, then dropped by SQL DEALLOCATE, which the proxy does not follow:
    the session's record of them stays bounded, least recently used first (found: it kept
    every one for the session's life, +14 MiB after 4,000 statements of 4 KB). A statement
    Bound now and then stays recorded and wrapped; one whose record was dropped passes
    through; every reply is PostgreSQL's."""
    n = (MAX_STATEMENT_RECORDS if pad == 0 else MAX_STATEMENT_CHARS // pad) + 40
    run = bind("hot") + execute() + SYNC
    steps: list[Step] = [(parse("first", Q) + parse("hot", Q) + SYNC, 1)]
    for i in range(n):
        steps.append((parse(f"d{i}", f"{Q} /* {i} {'x' * pad} */") + SYNC
                      + query(f"DEALLOCATE d{i}"), 2))
        if i % 10 == 9:
            steps.append((run, 1))
    steps += [(parse("keep", Q) + SYNC, 1), (bind("keep") + execute() + SYNC, 1),
              (bind("first") + execute() + SYNC, 1), (run, 1)]
    proxy_dsn, direct_dsn = env
    with psycopg.connect(proxy_dsn, autocommit=True) as c:
        before = int(stats(c)["proxy.wrapped"])
        proxied = _run(proxy_dsn, [*steps, (query("IMP SHOW STATS"), 1)])
        wrapped = int(stats(c)["proxy.wrapped"]) - before
    assert _shown(proxied[:-1]) == _shown(_run(direct_dsn, steps))
    records = int(_value(proxied[-1], "session.statement_records") or b"-1")
    assert 3 <= records <= MAX_STATEMENT_RECORDS
    if pad:   # the padded texts' characters are bounded too ("hot" and "keep" are short)
        assert records <= MAX_STATEMENT_CHARS // pad + 2
    assert wrapped == n // 10 + 2   # "hot" each time and "keep"; not "first"


def test_parse_skipped_after_an_error_in_the_pipeline(env: tuple[str, str]) -> None:
    """PostgreSQL skips a Parse after an error until the Sync: ``s9`` never exists."""
    assert_same_stream(env, [(parse("", "SELECT 1/0") + bind("") + execute() + parse("s9", Q)
                              + SYNC, 1),
                             (bind("s9") + execute() + SYNC, 1)])


def test_valid_named_statement_is_still_wrapped(env: tuple[str, str]) -> None:
    """A Bind alone of a named statement that still holds the recorded SQL is wrapped and
    answered from the sketch, with and without a Describe."""
    used = assert_same_stream(env, [(parse("v1", Q) + SYNC, 1),
                                    (bind("v1") + describe("P", "") + execute() + SYNC, 1),
                                    (bind("v1") + describe("S", "v1") + execute() + SYNC, 1)],
                              "proxy.used")
    assert used == 2


@pytest.mark.parametrize("types", [(), (20,)], ids=["inferred", "declared"])
def test_valid_named_statement_with_a_parameter_is_used(env: tuple[str, str],
                                                        types: tuple[int, ...]) -> None:
    proxy_dsn, _direct = env
    steps = [(parse("v2", QP, types) + SYNC, 1), (bind("v2", (b"150",)) + execute() + SYNC, 1)]

    def one_round() -> None:
        assert_same_stream(env, steps)
    with psycopg.connect(proxy_dsn, autocommit=True) as c:
        rounds_until_used(c, one_round)


def test_a_statement_whose_result_type_changed_gets_postgresqls_error(
        env: tuple[str, str]) -> None:
    """PostgreSQL answers a prepared statement whose result type changed since it was
    prepared with 0A000, and pgjdbc then prepares it again; the proxy's statement, parsed
    afresh, answered with the new type, which pgjdbc decoded as the old one (found: a numeric
    sum read as an int8, 562954248388608 for 1601800). The statement check compares the
    result types too."""
    table = ("SET client_min_messages = warning; DROP TABLE IF EXISTS rt_ps;"
             " CREATE TABLE rt_ps (g int NOT NULL, v int NOT NULL);"
             " INSERT INTO rt_ps SELECT i % 40, i FROM generate_series(1, 4000) i;"
             " ANALYZE rt_ps")
    q = "SELECT g, sum(v) AS s FROM rt_ps GROUP BY g HAVING count(*) > 99 ORDER BY g"
    steps = [(query(table), 1), (parse("rt1", q) + SYNC, 1)]
    steps += [(bind("rt1") + execute() + SYNC, 1)] * 3
    steps += [(query("ALTER TABLE rt_ps ALTER COLUMN v TYPE bigint"), 1),
              (bind("rt1") + execute() + SYNC, 1), (PREPARED, 1)]
    assert assert_same_stream(env, steps) >= 1
    assert _run(env[1], steps)[-2][0][0] == ord("E")


# ------------------------------------------------------------------ a batch in pieces

def _split(data: bytes, *at: int) -> tuple[bytes, ...]:
    cuts = (0, *at, len(data))
    return tuple(data[a:b] for a, b in itertools.pairwise(cuts))


@pytest.mark.parametrize("where", ["in the parse", "in the bind", "in a header",
                                   "in the sync", "three pieces"])
def test_a_batch_read_in_pieces_is_wrapped(env: tuple[str, str], where: str) -> None:
    """A batch that reached the proxy in two reads or more was never wrapped: its Parse was
    looked at before the rest was there (found in session 29: a batch of 300 kB, more than
    one read of the proxy, and any batch a network splits into segments, so a query was
    sped up or not by chance). Now the proxy waits for the rest of a message it has begun
    to read, when the batch may still become one it wraps."""
    batch = parse("", Q) + bind("") + describe("P", "") + execute() + SYNC
    alone = bind("pc") + execute() + SYNC   # a named statement's batch without its Parse
    p, b, b2 = len(parse("", Q)), len(bind("")), len(bind("pc"))
    at, at_alone = {"in the parse": ((p // 2,), (3,)),
                    "in the bind": ((p + b // 2,), (b2 // 2,)),
                    "in a header": ((p + b + 2,), (b2 + 2,)),
                    "in the sync": ((len(batch) - 1,), (len(alone) - 1,)),
                    "three pieces": ((7, p + 3), (2, b2 + 1))}[where]
    steps: list[Step] = [(_split(batch, *at), 1), (parse("pc", Q) + SYNC, 1),
                         (_split(alone, *at_alone), 1)]
    assert assert_same_stream(env, steps) == 2


def test_a_client_waiting_between_two_messages_gets_its_reply(env: tuple[str, str]) -> None:
    """A client may send a Parse without a Sync or Flush and wait for its error, which
    PostgreSQL sends at once: bytes that end with a whole message of a batch the proxy may
    wrap wait for the rest only ``--batch-wait`` (10 ms), then go on as they are."""
    bad = Q.replace("FROM ps", "FROM ps_missing")
    proxy_dsn, direct_dsn = env
    for dsn in (direct_dsn, proxy_dsn):
        c = _client(dsn)
        try:
            c.send(parse("", bad))
            assert c.readable(10), "no reply to the Parse"
            m = c.read()
            assert m is not None and m[0] == ord("E")
            assert codec.decode_error_fields(m[1]).sqlstate == "42P01"
            c.send(SYNC)
            assert _until(c, 1)[-1][0] == ord("Z")
        finally:
            c.close()


@pytest.fixture(scope="module")
def patient_env(env: tuple[str, str], start_proxy: StartProxy, db_dsn: str) -> tuple[str, str]:
    """``env`` through a proxy that waits 1 s (``--batch-wait``) between two messages of a
    batch it may wrap: 20 times a test's pause between the pieces."""
    proxy = start_proxy("--batch-wait", "1", hook="sketches.manager:SketchManager")
    return via_proxy(db_dsn, proxy.port), env[1]


@pytest.mark.parametrize("where", ["after the parse", "after the bind", "after the describe"])
def test_a_batch_read_in_whole_messages_is_wrapped(patient_env: tuple[str, str],
                                                   where: str) -> None:
    """libpq 16 and later send each message of 8 kB or more on its own: psycopg's Parse of
    a long query often reached the proxy alone, and its batch passed through (found in
    session 29). Bytes that end between two messages of a batch the proxy may wrap wait up
    to ``--batch-wait`` for the rest."""
    batch = parse("", Q) + bind("") + describe("P", "") + execute() + SYNC
    alone = bind("pb") + describe("P", "") + execute() + SYNC
    p, b, b2, d = len(parse("", Q)), len(bind("")), len(bind("pb")), len(describe("P", ""))
    at, at_alone = {"after the parse": (p, b2), "after the bind": (p + b, b2),
                    "after the describe": (p + b + d, b2 + d)}[where]
    steps: list[Step] = [(_split(batch, at), 1), (parse("pb", Q) + SYNC, 1),
                         (_split(alone, at_alone), 1)]
    assert assert_same_stream(patient_env, steps) == 2


def _first_reply(c: RawClient, pieces: tuple[bytes, ...], gap: float) -> float:
    """Sends ``pieces`` ``gap`` s apart, watching for a reply meanwhile; seconds from the
    first piece to the first reply (the rest of the pieces are not sent after it)."""
    t0 = time.monotonic()
    for piece in pieces:
        c.send(piece)
        if c.readable(gap):
            return time.monotonic() - t0
    assert c.readable(10), "no reply"
    return time.monotonic() - t0


def test_batch_wait_bounds_the_batch_not_each_gap(patient_env: tuple[str, str]) -> None:
    """The wait between two messages ran anew at every message: a Parse that fails, then a
    Bind and a Describe 0.6 s apart each, got its error after up to 2.5 s with a wait of 1 s
    (found by a regression search in session 29: 35 ms at 10 ms, messages 8 ms apart). One
    wait per batch: the error comes about 1 s after the Parse (PostgreSQL's at once)."""
    c = _client(patient_env[0])
    try:
        pieces = (parse("", Q.replace("FROM ps", "FROM ps_missing")), bind(""),
                  describe("P", ""), execute())
        took = _first_reply(c, pieces, 0.6)
        m = c.read()
        assert m is not None and m[0] == ord("E"), m
        assert took < 1.9, f"the error came {took:.2f} s after the Parse (batch wait 1 s)"
    finally:
        c.close()


def test_a_malformed_describe_gets_postgresqls_error(env: tuple[str, str]) -> None:
    """A batch whose Describe has an unknown kind ended the session with the proxy's FATAL;
    PostgreSQL answers an ERROR and the session goes on (found by the regression search of
    session 29: read in pieces, such a batch now reaches the shape check, where one read in
    one piece did before)."""
    bad = b"D" + (6).to_bytes(4, "big") + b"X\x00"
    batch = parse("", Q) + bind("") + bad + execute() + SYNC
    for data in (batch, _split(batch, len(parse("", Q)))):
        assert_same_stream(env, [(data, 1), (query("SELECT 1"), 1)])


@pytest.fixture(scope="module")
def hasty_env(env: tuple[str, str], start_proxy: StartProxy, db_dsn: str) -> tuple[str, str]:
    """``env`` through a proxy that never waits between two messages (``--batch-wait 0``)."""
    proxy = start_proxy("--batch-wait", "0", hook="sketches.manager:SketchManager")
    return via_proxy(db_dsn, proxy.port), env[1]


def test_no_batch_wait_leaves_no_wait_behind(hasty_env: tuple[str, str]) -> None:
    """With ``--batch-wait 0`` a batch that ended between two messages went on, but left the
    length it wanted behind: a later simple Query read in two pieces was held for bytes
    that never came (found by the regression search of session 29)."""
    batch = parse("", Q) + bind("") + describe("P", "") + execute() + SYNC
    p, b = len(parse("", Q)), len(bind(""))
    steps: list[Step] = [(_split(batch, p + b), 1), (_split(query("SELECT 1"), 3), 1)]
    assert assert_same_stream(hasty_env, steps) == 0
