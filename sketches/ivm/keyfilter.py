"""Membership filter on join keys (IMP §7.2, "Bloom filters for join"): before a join ships the
keys of a delta to PostgreSQL to fetch their partners, keys that surely have no partner are
dropped, and when none remain the round trip is skipped.

The filter is a *superset* of the keys present on the other side: built at capture from the
column's distinct values, extended with the keys of every inserted delta row, never shrunk on
deletions (a deleted key only causes a useless lookup). So it is never wrong, only sometimes
less selective. Integer keys in [0, 2^32) live in an exact pyroaring bitmap (cheap to build and
probe; DESIGN §9), anything else in a Python set.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable

from pyroaring import BitMap

from sketches.ivm.codec import Json, decode_value, encode_value

_MAX = 2**32


class KeyFilter:
    __slots__ = ("ints", "others")

    def __init__(self, keys: Iterable[object] = ()) -> None:
        self.ints = BitMap()
        self.others: set[object] = set()
        self.update(keys)

    @staticmethod
    def _small(key: object) -> bool:
        return isinstance(key, int) and not isinstance(key, bool) and 0 <= key < _MAX

    def update(self, keys: Iterable[object]) -> None:
        small: list[int] = []
        for k in keys:
            if k is None:
                continue
            if self._small(k):
                small.append(k)  # type: ignore[arg-type]
            else:
                self.others.add(k)
        if small:
            self.ints.update(small)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, int) and self._small(key):
            return key in self.ints
        return key in self.others

    def __len__(self) -> int:
        return len(self.ints) + len(self.others)

    def snapshot(self) -> Json:
        return {"ints": base64.b64encode(self.ints.serialize()).decode(),
                "others": [encode_value(v) for v in self.others]}

    @classmethod
    def restore(cls, data: Json) -> KeyFilter:
        f = cls()
        f.ints = BitMap.deserialize(base64.b64decode(data["ints"]))
        f.others = {decode_value(v) for v in data["others"]}
        return f
