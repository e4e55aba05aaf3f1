"""Binary Bind parameters of date, time, timestamp, timestamptz and uuid as text.

Why: psycopg sends ``date``, ``time``, ``datetime`` and ``UUID`` values in binary format by
default, and the proxy gave the sketch library no value for them, so such a query never used
a sketch (found by a helper's TPC-H search in session 33: every ``l_shipdate >= %s`` fell
back). The library takes these types as text, as it does when a client sends them in text
format.

Contract: the text reads back in PostgreSQL as the same value under every DateStyle and
TimeZone (ISO 8601, a timestamptz with its ``+00:00`` offset), or None when it cannot be
written so (a value outside Python's years 1–9999, a body of the wrong size).
"""

from __future__ import annotations

import datetime as dt
import struct
import uuid
from collections.abc import Callable

from sketches.typeoids import DATE, TIME, TIMESTAMP, TIMESTAMPTZ, UUID

from ._struct import INT32, INT64

_EPOCH = dt.datetime(2000, 1, 1)   # PostgreSQL's epoch for dates and timestamps
_DATE_END, _DATE_BEGIN = 2**31 - 1, -(2**31)
_TIMESTAMP_END, _TIMESTAMP_BEGIN = 2**63 - 1, -(2**63)
_DAY = 86_400_000_000   # µs; 24:00:00 is a time of day in PostgreSQL


def text_of_binary(oid: int, raw: bytes) -> str | None:
    """``raw`` (a parameter of type ``oid`` in binary format) as text, or None (see above)."""
    decode = _DECODERS.get(oid)
    if decode is None:
        return None
    try:
        return decode(raw)
    except (struct.error, OverflowError, ValueError):
        return None


def _date(raw: bytes) -> str:
    (days,) = INT32.unpack(raw)
    if days == _DATE_END:
        return "infinity"
    if days == _DATE_BEGIN:
        return "-infinity"
    return (_EPOCH.date() + dt.timedelta(days=days)).isoformat()


def _time(raw: bytes) -> str:
    (micros,) = INT64.unpack(raw)
    if not 0 <= micros <= _DAY:
        raise ValueError(f"time of day out of range: {micros} µs")
    seconds, fraction = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return f"{hour:02d}:{minute:02d}:{second:02d}.{fraction:06d}"


def _timestamp(raw: bytes, offset: str = "") -> str:
    (micros,) = INT64.unpack(raw)
    if micros == _TIMESTAMP_END:
        return "infinity"
    if micros == _TIMESTAMP_BEGIN:
        return "-infinity"
    return (_EPOCH + dt.timedelta(microseconds=micros)).isoformat(sep=" ") + offset


def _timestamptz(raw: bytes) -> str:
    return _timestamp(raw, "+00:00")


def _uuid(raw: bytes) -> str:
    return str(uuid.UUID(bytes=raw))


_DECODERS: dict[int, Callable[[bytes], str]] = {
    DATE: _date, TIME: _time, TIMESTAMP: _timestamp, TIMESTAMPTZ: _timestamptz, UUID: _uuid,
}
