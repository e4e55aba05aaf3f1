"""JSON encoding of row values and Z-sets for persisted operator state.

JSON-native values (None, bool, int, str) are stored as they are; everything else is a one-key
object tagging its type, so a round trip returns equal values of the same Python type.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import Any, TypeAlias

from sketches.ivm.errors import StateFormatError
from sketches.ivm.zset import Ann, Row, ZSet

Json: TypeAlias = Any  # JSON-able value (dict/list/str/int/float/bool/None)

_ENCODERS: tuple[tuple[type, str, Callable[[Any], Json]], ...] = (
    (Decimal, "dec", str),
    (Fraction, "frac", lambda f: [f.numerator, f.denominator]),
    (float, "float", repr),
    (dt.datetime, "ts", lambda v: v.isoformat()),
    (dt.date, "date", lambda v: v.isoformat()),
    (dt.time, "time", lambda v: v.isoformat()),
    (dt.timedelta, "td", lambda v: [v.days, v.seconds, v.microseconds]),
    (bytes, "bytes", lambda v: v.hex()),
    (uuid.UUID, "uuid", str),
)

_DECODERS: dict[str, Callable[[Any], object]] = {
    "dec": Decimal,
    "frac": lambda v: Fraction(v[0], v[1]),
    "float": float,
    "ts": dt.datetime.fromisoformat,
    "date": dt.date.fromisoformat,
    "time": dt.time.fromisoformat,
    "td": lambda v: dt.timedelta(days=v[0], seconds=v[1], microseconds=v[2]),
    "bytes": bytes.fromhex,
    "uuid": uuid.UUID,
    "tuple": lambda v: tuple(decode_value(x) for x in v),
}


def encode_value(value: object) -> Json:
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, tuple):
        return {"tuple": [encode_value(v) for v in value]}
    for typ, tag, fn in _ENCODERS:
        if isinstance(value, typ):
            return {tag: fn(value)}
    raise StateFormatError(f"cannot persist a value of type {type(value).__name__}")


def decode_value(data: Json) -> object:
    if data is None or isinstance(data, bool | str | int):
        return data
    if isinstance(data, dict) and len(data) == 1:
        ((tag, payload),) = data.items()
        decoder = _DECODERS.get(tag)
        if decoder is not None:
            return decoder(payload)
    raise StateFormatError(f"cannot decode persisted value {data!r}")


def encode_row(row: Row) -> Json:
    return [encode_value(v) for v in row]


def decode_row(data: Json) -> Row:
    return tuple(decode_value(v) for v in data)


def encode_ann(ann: Ann) -> Json:
    return [sorted(s) for s in ann]


def decode_ann(data: Json) -> Ann:
    return tuple(frozenset(int(f) for f in s) for s in data)


def encode_zset(z: ZSet) -> Json:
    return [[encode_row(r), encode_ann(a), w] for r, a, w in z]


def decode_zset(data: Json) -> ZSet:
    return ZSet((decode_row(r), decode_ann(a), int(w)) for r, a, w in data)


DUMP_SLICE = 2_000
"""Elements of a long list per slice (:func:`dumps`)."""
SLICES = "__slices__"
LENGTH = "__len__"
"""The two keys of the object :func:`dumps` writes for a long list: its slices' texts and
its length (a slice lost or cut short is refused when read)."""


def dumps(value: Json, slice_len: int = DUMP_SLICE) -> str:
    """JSON text of ``value`` that :func:`loads` reads back, a list longer than ``slice_len``
    that is a dict's value (at any depth of dicts) written as ``{"__slices__": [text of each
    slice, …], "__len__": its length}``. Why: one ``json.dumps`` or ``json.loads`` call for
    a large state — a million groups, 1–3 s — holds the interpreter throughout, and the
    proxy's relay waited for it (``bench/results/large-state-s27``); a slice at a time,
    other threads run in between, writing and reading."""
    parts: list[str] = []
    _dump(value, slice_len, parts)
    return "".join(parts)


def _dump(value: Json, slice_len: int, out: list[str]) -> None:
    if not (isinstance(value, dict) and all(isinstance(k, str) for k in value)):
        out.append(json.dumps(value))
        return
    out.append("{")
    for i, (k, v) in enumerate(value.items()):
        out.append(f"{', ' if i else ''}{json.dumps(k)}: ")
        if isinstance(v, list | tuple) and len(v) > slice_len:
            texts = [json.dumps(v[start:start + slice_len])
                     for start in range(0, len(v), slice_len)]
            out.append(json.dumps({SLICES: texts, LENGTH: len(v)}))
        else:
            _dump(v, slice_len, out)
    out.append("}")


def loads(text: str | bytes) -> Json:
    """The value :func:`dumps` wrote (or plain JSON), its sliced lists decoded a slice per
    ``json.loads`` call; :class:`StateFormatError` for text that is not such JSON (a state
    edited by hand: the caller builds it anew)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise StateFormatError(f"persisted state is no JSON: {exc}") from exc
    return _unslice(value)


def _unslice(value: Json) -> Json:
    if not isinstance(value, dict):
        return value
    if SLICES not in value:
        return {k: _unslice(v) for k, v in value.items()}
    texts, length = value[SLICES], value.get(LENGTH)
    if set(value) != {SLICES, LENGTH} or not isinstance(texts, list) or type(length) is not int:
        raise StateFormatError("a sliced list of a persisted state is malformed")
    out: list[Json] = []
    for text in texts:
        try:
            part = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise StateFormatError(f"a slice of a persisted state is no JSON: {exc}") from exc
        if not isinstance(part, list):
            raise StateFormatError("a slice of a persisted state is no list")
        out.extend(part)
    if len(out) != length:
        raise StateFormatError(f"a sliced list of a persisted state holds {len(out)} "
                               f"elements, not {length}")
    return out
