"""Sans-IO protocol layer, fed with byte literals."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imp_proxy import intercept
from imp_proxy.protocol import codec
from imp_proxy.protocol.framing import (
    BoundaryScanner,
    MessageReader,
    ProtocolViolation,
    decode_startup,
    frame_end,
    plain_prefix,
    split_startup,
)
from imp_proxy.protocol.messages import (
    AuthenticationSASL,
    Bind,
    CancelRequest,
    FieldDescription,
    GSSENCRequest,
    SSLRequest,
    StartupMessage,
)

STARTUP = (b"\x00\x00\x00\x45\x00\x03\x00\x00user\x00alice\x00database\x00db1\x00"
           b"options\x00-c x=1\x00extra_float_digits\x003\x00\x00")


def test_startup_packets() -> None:
    assert decode_startup(b"\x00\x00\x00\x08\x04\xd2\x16\x2f") == SSLRequest()
    assert decode_startup(b"\x00\x00\x00\x08\x04\xd2\x16\x30") == GSSENCRequest()
    assert decode_startup(b"\x00\x00\x00\x10\x04\xd2\x16\x2e\x00\x00\x30\x39\xff\xff\xff\xfe") \
        == CancelRequest(12345, -2)
    msg = decode_startup(STARTUP)
    assert isinstance(msg, StartupMessage)
    assert msg.protocol == 196608 and msg.raw == STARTUP
    assert msg.params == {"user": "alice", "database": "db1", "options": "-c x=1",
                          "extra_float_digits": "3"}
    assert codec.encode_startup(msg.params) == STARTUP


def test_split_startup_waits_and_rejects() -> None:
    assert split_startup(STARTUP[:10]) == (None, 0)
    packet, n = split_startup(STARTUP + b"\x00\x00")
    assert packet == STARTUP and n == len(STARTUP)
    with pytest.raises(ProtocolViolation):
        split_startup(b"\x00\x00\x00\x04\x00\x03\x00\x00")
    with pytest.raises(ProtocolViolation):
        split_startup(b"\x7f\x00\x00\x00\x00\x03\x00\x00")
    with pytest.raises(ProtocolViolation):  # protocol 2
        decode_startup(b"\x00\x00\x00\x09\x00\x02\x00\x00\x00")
    with pytest.raises(ProtocolViolation):  # missing final terminator
        decode_startup(b"\x00\x00\x00\x0e\x00\x03\x00\x00user\x00a\x00")


def test_frame_end_and_limits() -> None:
    data = b"Q\x00\x00\x00\x0dSELECT 1\x00S\x00\x00\x00\x04"
    assert frame_end(data, 0, 1000) == 14
    assert frame_end(data, 14, 1000) == 19
    assert frame_end(data[:10], 0, 1000) == -1
    with pytest.raises(ProtocolViolation):
        frame_end(b"Q\x00\x00\x00\x02", 0, 1000)
    with pytest.raises(ProtocolViolation):
        frame_end(b"Q\x00\x01\x00\x00", 0, 1000)


def test_message_reader_across_chunks() -> None:
    r = MessageReader()
    stream = b"1\x00\x00\x00\x04" + b"Z\x00\x00\x00\x05I" + b"C\x00\x00\x00\x0dSELECT 1\x00"
    out = []
    for i in range(len(stream)):
        out += r.feed(stream[i:i + 1])
    assert [chr(t) for t, _ in out] == ["1", "Z", "C"]
    assert out[2][1] == b"C\x00\x00\x00\x0dSELECT 1\x00"
    assert r.pending == 0


_MESSAGES = st.lists(st.tuples(st.sampled_from(b"DCZEN"), st.binary(max_size=12)),
                     max_size=12)


@given(_MESSAGES, st.lists(st.integers(min_value=1, max_value=40), max_size=30))
def test_plain_runs_and_the_reader_relay_a_stream_whole(
        messages: list[tuple[int, bytes]], cuts: list[int]) -> None:
    """``Session._relay_plain``'s steps over a stream read in arbitrary chunks: the reader
    completes a message begun in an earlier chunk (``missing``), ``plain_prefix`` passes the
    complete messages before the first ReadyForQuery or ErrorResponse on as they are, the
    reader takes the rest apart. Every byte comes out once, in order, and every Z and E
    message goes through the reader."""
    stream = b"".join(bytes((t,)) + struct.pack("!i", 4 + len(b)) + b for t, b in messages)
    chunks, pos = [], 0
    for n in cuts:
        chunks.append(stream[pos:pos + n])
        pos += n
    chunks.append(stream[pos:])
    reader, out, parsed = MessageReader(), bytearray(), []
    for data in chunks:
        done = reader.missing(data)
        if done:
            msgs = reader.feed(data[:done])
            parsed += msgs
            out += b"".join(m for _t, m in msgs)
            data = data[done:]
        k = plain_prefix(data, b"ZE", 1000) if not reader.pending else 0
        out += data[:k]
        msgs = reader.feed(data[k:])
        parsed += msgs
        out += b"".join(m for _t, m in msgs)
    assert bytes(out) == stream and reader.pending == 0
    stops = [bytes((t,)) + struct.pack("!i", 4 + len(b)) + b for t, b in messages if t in b"ZE"]
    assert [m for t, m in parsed if t in b"ZE"] == stops


def test_plain_prefix_stops_where_the_reader_must_look() -> None:
    d = b"D\x00\x00\x00\x06\x00\x00"
    z = b"Z\x00\x00\x00\x05I"
    assert plain_prefix(d + d + z + d, b"ZE", 1000) == 2 * len(d)
    assert plain_prefix(d + d[:4], b"ZE", 1000) == len(d)          # an incomplete message
    assert plain_prefix(d + b"D\x00\x00\x00\x02" + d, b"ZE", 1000) == len(d)  # bad length
    assert plain_prefix(d + b"D\x00\x01\x00\x00", b"ZE", 100) == len(d)  # over max_size
    r = MessageReader()
    assert r.missing(d) == 0
    r.feed(d[:3])
    assert r.missing(d[3:] + z) == len(d) - 3
    assert r.missing(b"\x00") == 1
    r.feed(d[3:])
    assert r.pending == 0 and r.missing(z) == 0


@pytest.mark.parametrize("step", [1, 2, 3, 5, 7, 100])
def test_boundary_scanner_counts_ready_for_query(step: int) -> None:
    # a DataRow whose payload looks like a ReadyForQuery (or a ParameterStatus) must not be
    # counted; the ParameterStatus of a SET is
    fake = b"Z\x00\x00\x00\x05E"
    status = b"S\x00\x00\x00\x11TimeZone\x00UTC\x00"
    stream = (b"T\x00\x00\x00\x1a\x00\x01a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x19"
              b"\xff\xff\xff\xff\xff\xff\x00\x00"
              + b"D\x00\x00\x00\x10\x00\x01\x00\x00\x00\x06" + fake
              + b"D\x00\x00\x00\x1c\x00\x01\x00\x00\x00\x12" + status
              + b"C\x00\x00\x00\x0dSELECT 1\x00" + b"Z\x00\x00\x00\x05T"
              + status + b"Z\x00\x00\x00\x05I")
    s = BoundaryScanner()
    seen = []
    total = 0
    for i in range(0, len(stream), step):
        total += s.feed(stream[i:i + step])
        seen.append(chr(s.status))
    assert total == 2
    assert s.status == ord("I") and s.at_boundary
    assert "E" not in seen
    assert s.parameters == 1


def test_boundary_scanner_to_boundary() -> None:
    s = BoundaryScanner()
    msg = b"A\x00\x00\x00\x0d\x00\x00\x00\x07ch\x00p\x00"
    assert s.feed(msg[:3]) == 0 and not s.at_boundary
    rest = msg[3:] + b"Z\x00\x00\x00\x05I"
    k = s.to_boundary(rest)
    assert k == len(msg) - 3 and s.at_boundary
    assert s.feed(rest[k:]) == 1


def test_frontend_codecs_roundtrip() -> None:
    parse = codec.encode_parse("s1", "SELECT $1::int", [23])
    assert parse == b"P\x00\x00\x00\x1cs1\x00SELECT $1::int\x00\x00\x01\x00\x00\x00\x17"
    p = codec.decode_parse(parse)
    assert (p.name, p.sql, p.param_types) == ("s1", "SELECT $1::int", (23,))
    bind = Bind("", "s1", (1,), (b"\x00\x00\x00\x2a", None), (0,))
    raw = codec.encode_bind(bind)
    assert raw == (b"B\x00\x00\x00\x1e\x00s1\x00\x00\x01\x00\x01\x00\x02"
                   b"\x00\x00\x00\x04\x00\x00\x00\x2a\xff\xff\xff\xff\x00\x01\x00\x00")
    assert codec.decode_bind(raw) == bind
    assert bind.param_format(1) == 1
    assert codec.decode_execute(codec.encode_execute("p", 10)).max_rows == 10
    assert codec.decode_describe(b"D\x00\x00\x00\x08Ss1\x00").name == "s1"
    c = codec.decode_close(b"C\x00\x00\x00\x06P\x00")
    assert (c.kind, c.name) == ("P", "")
    assert codec.decode_query(b"Q\x00\x00\x00\x0dSELECT 1\x00").sql == "SELECT 1"
    assert codec.encode_sync() == b"S\x00\x00\x00\x04"
    assert codec.encode_cancel_request(7, 9) == (b"\x00\x00\x00\x10\x04\xd2\x16\x2e"
                                                  b"\x00\x00\x00\x07\x00\x00\x00\x09")
    with pytest.raises(ProtocolViolation):
        codec.decode_bind(b"B\x00\x00\x00\x08\x00s1\x00")


def test_counts_are_unsigned_up_to_65535() -> None:
    """PostgreSQL reads a message's counts as unsigned 16-bit integers (found by a helper's
    search in session 26: 32,768 parameters read as a negative count ended the session)."""
    bind = Bind("", "", (), tuple(b"7" for _ in range(40000)), ())
    assert codec.decode_bind(codec.encode_bind(bind)) == bind
    binary = Bind("", "s", (1,) * 40000, (b"\x00\x00\x00\x07",) * 40000, (1, 0, -1))
    assert codec.decode_bind(codec.encode_bind(binary)) == binary
    assert codec.decode_parse(codec.encode_parse("", "SELECT 1", (2**32 - 1, 0))
                              ).param_types == (2**32 - 1, 0)
    types = (23,) * 65535
    assert codec.decode_parse(codec.encode_parse("", "SELECT 1", types)).param_types == types
    described = codec.encode_parameter_description(types)
    assert intercept._parameter_types(described) == types
    row = codec.encode_data_row([b"x"] * 40000)
    assert codec.decode_data_row(row).values == (b"x",) * 40000


@pytest.mark.parametrize("body", [
    b"\x00\x00\x00\x00\xff\xff\x00\x00",          # 65535 parameters, none there
    b"\x00\x00\xff\xff\x00\x00\x00\x00",          # 65535 format codes, none there
    b"\x00\x00\x00\x00\x00\x00\x00\x00junk",      # bytes after the result formats
], ids=["parameters", "formats", "trailing"])
def test_a_bind_postgresql_rejects_is_not_decoded(body: bytes) -> None:
    """Such a Bind is PostgreSQL's to answer (08P01); decoded, it was wrapped and the proxy
    sent a well-formed Bind of its own in its place (found by the same search)."""
    with pytest.raises(ProtocolViolation):
        codec.decode_bind(b"B" + (len(body) + 4).to_bytes(4, "big") + body)


def test_a_parse_with_bytes_after_its_types_is_not_decoded() -> None:
    with pytest.raises(ProtocolViolation):
        body = b"\x00SELECT 1\x00\x00\x00junk"
        codec.decode_parse(b"P" + (len(body) + 4).to_bytes(4, "big") + body)


def test_backend_codecs() -> None:
    err = codec.encode_error("FATAL", "08P01", "bad frame")
    assert err == b"E\x00\x00\x00\x25SFATAL\x00VFATAL\x00C08P01\x00Mbad frame\x00\x00"
    e = codec.decode_error_fields(err)
    assert (e.severity, e.sqlstate, e.message) == ("FATAL", "08P01", "bad frame")
    assert codec.encode_ready_for_query("I") == b"Z\x00\x00\x00\x05I"
    assert codec.decode_ready_for_query(b"Z\x00\x00\x00\x05T").status == "T"
    rd = codec.encode_row_description([FieldDescription("key"), FieldDescription("value")])
    assert [f.name for f in codec.decode_row_description(rd).fields] == ["key", "value"]
    dr = codec.encode_data_row([b"a", None, b""])
    assert dr == b"D\x00\x00\x00\x13\x00\x03\x00\x00\x00\x01a\xff\xff\xff\xff\x00\x00\x00\x00"
    assert codec.decode_data_row(dr).values == (b"a", None, b"")
    assert codec.decode_command_complete(codec.encode_command_complete("SELECT 2")).tag \
        == "SELECT 2"
    k = codec.decode_backend_key_data(b"K\x00\x00\x00\x0c\x00\x00\x01\x00\x12\x34\x56\x78")
    assert (k.pid, k.secret) == (256, 0x12345678)
    ps = codec.decode_parameter_status(b"S\x00\x00\x00\x11TimeZone\x00UTC\x00")
    assert (ps.name, ps.value) == ("TimeZone", "UTC")


def test_sasl_plus_mechanisms_are_not_advertised() -> None:
    both = (b"R\x00\x00\x00\x2a\x00\x00\x00\x0aSCRAM-SHA-256-PLUS\x00SCRAM-SHA-256\x00\x00")
    assert codec.decode_authentication(both) == AuthenticationSASL(
        ("SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"))
    stripped = codec.strip_channel_binding(both)
    assert stripped == b"R\x00\x00\x00\x17\x00\x00\x00\x0aSCRAM-SHA-256\x00\x00"
    plain = b"R\x00\x00\x00\x17\x00\x00\x00\x0aSCRAM-SHA-256\x00\x00"
    assert codec.strip_channel_binding(plain) is plain
    md5 = b"R\x00\x00\x00\x0c\x00\x00\x00\x05abcd"
    assert codec.strip_channel_binding(md5) is md5
