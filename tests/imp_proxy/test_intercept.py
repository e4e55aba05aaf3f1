"""Bind parameters decoded for the sketch library (imp_proxy.intercept.decode_params): the
values PostgreSQL itself compares, or None (the query then passes through)."""

from __future__ import annotations

import struct
from decimal import Decimal

import psycopg
import pytest

from imp_proxy.intercept import decode_params, pg_bool
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
