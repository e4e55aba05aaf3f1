"""Bind parameters decoded for the sketch library (imp_proxy.intercept.decode_params): the
values PostgreSQL itself compares, or None (the query then passes through)."""

from __future__ import annotations

import struct
from decimal import Decimal

import psycopg
import pytest

from imp_proxy.intercept import decode_params, pg_bool
from imp_proxy.protocol.binary_text import text_of_binary
from imp_proxy.protocol.messages import Bind

FLOAT4, FLOAT8, INT8, NUMERIC, TEXT = 700, 701, 20, 1700, 25


def bind(params: tuple[bytes | None, ...], formats: tuple[int, ...] = ()) -> Bind:
    return Bind("", "", formats, params, ())


def test_text_and_binary_parameters() -> None:
    got = decode_params(bind((b"0.1", b"-7", b"1.50", None, b"x")),
                        (FLOAT8, INT8, NUMERIC, INT8, TEXT))
    assert got == [0.1, -7, Decimal("1.50"), None, "x"]
    assert decode_params(bind((struct.pack("!d", 0.1), struct.pack("!q", 5)), (1,)),
                         (FLOAT8, INT8)) == [0.1, 5]


def test_a_float4_is_not_decoded() -> None:
    """PostgreSQL reads '0.1' as the float4 nearest 0.1; float('0.1') is another number. A
    binary float4 is exact, but no float8 where it is cast to text (its widening's text is
    ``0.10000000149011612``) or meets another float4 in arithmetic."""
    assert decode_params(bind((b"0.1",)), (FLOAT4,)) is None
    assert decode_params(bind((struct.pack("!f", 0.1),), (1,)), (FLOAT4,)) is None
    assert decode_params(bind((b"\x00",), (1,)), (NUMERIC,)) is None   # binary numeric


SPELLINGS = ["t", "tr", "TRUE", " yes ", "ye", "y", "on", "ON", "1", "f", "fal", "false", "n",
             "no", "of", "off", "0", "\tOff\n", "o", "", "tru e", "yess", "2", "onn", "-"]


def test_booleans_read_as_postgresql_reads_them(conn: psycopg.Connection[object]) -> None:
    """Every spelling decodes to PostgreSQL's own value, or not at all where PostgreSQL fails
    (the query then passes through and fails there). Found: ``'tr'`` and ``'ye'`` were read
    as false, the value a HAVING on a boolean group key would have been evaluated with, and
    ``'o'`` as false where PostgreSQL fails."""
    for text in SPELLINGS:
        try:
            want: bool | None = conn.execute("SELECT %s::bool", (text,)).fetchone()[0]
        except psycopg.errors.InvalidTextRepresentation:
            conn.rollback()
            want = None
        if want is None:
            with pytest.raises(ValueError):
                pg_bool(text)
            assert decode_params(bind((text.encode(),)), (16,)) is None
        else:
            assert pg_bool(text) is want, text
            assert decode_params(bind((text.encode(),)), (16,)) == [want]


BINARY_VALUES = {
    "date": ["2000-01-01", "1999-12-31", "2020-02-29", "0001-01-01", "9999-12-31",
             "infinity", "-infinity", "4713-01-01 BC", "10000-01-01"],
    "timestamp": ["2000-01-01 00:00", "1970-01-01 00:00:00.000001", "1899-12-31 23:59:59.999999",
                  "0001-01-01 00:00", "infinity", "-infinity", "0044-03-15 12:00 BC",
                  "12000-01-01 00:00"],
    "timestamptz": ["2020-06-01 12:00:00+05:30", "2000-01-01 00:00:00.5-08", "infinity",
                    "-infinity", "1900-01-01 00:00+00", "0001-01-01 01:30+01",
                    "0001-01-01 00:30+01"],
    "time": ["00:00", "23:59:59.999999", "24:00:00", "12:34:56.5"],
    "uuid": ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "00000000-0000-0000-0000-000000000000"],
}


@pytest.mark.parametrize("type_name", sorted(BINARY_VALUES))
def test_binary_temporal_and_uuid_parameters_read_back_as_the_same_value(
        conn: psycopg.Connection[object], type_name: str) -> None:
    """PostgreSQL's own binary send format (``<type>_send``) of each value, written as text,
    is that value again under a DateStyle and TimeZone far from ISO and UTC; a value Python
    cannot write (before year 1, after 9999) is not decoded, and the query passes through."""
    conn.execute("SET DateStyle = 'SQL, DMY'")
    conn.execute("SET TimeZone = 'Pacific/Kiritimati'")
    oid = conn.execute("SELECT %s::regtype::oid", (type_name,)).fetchone()[0]
    for value in BINARY_VALUES[type_name]:
        raw = conn.execute(f"SELECT {type_name}_send(%s::{type_name})", (value,)).fetchone()[0]
        text = text_of_binary(oid, raw)
        if text is None:
            at = " AT TIME ZONE 'UTC'" if type_name == "timestamptz" else ""
            year = conn.execute(f"SELECT extract(year FROM %s::{type_name}{at})",
                                (value,)).fetchone()[0]
            assert not 1 <= year <= 9999, value
            assert decode_params(bind((raw,), (1,)), (oid,)) is None
            continue
        same = conn.execute(f"SELECT %s::{type_name} = %s::{type_name}", (text, value))
        assert same.fetchone()[0] is True, (value, text)
        assert decode_params(bind((raw,), (1,)), (oid,)) == [text]
    assert text_of_binary(oid, b"\x00") is None   # a body of the wrong size
