"""Z-sets of annotated rows: ``(row, P) -> weight`` with integer weights (DBSP).

``row`` is a tuple of Python values; ``P`` (an :data:`Ann`) holds one fragment set per sketched
table of the query (slot ``i`` for the ``i``-th sketched table; a table without a sketch
contributes nothing). Weights are never assumed non-zero by callers: the container drops entries
whose weight becomes zero, so it is always consolidated.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterable, Iterator
from typing import TypeAlias

Row: TypeAlias = tuple[object, ...]
Ann: TypeAlias = tuple[frozenset[int], ...]
Entry: TypeAlias = tuple[Row, Ann, int]


def empty_ann(slots: int) -> Ann:
    """The annotation of a tuple that depends on no sketched fragment."""
    return tuple(frozenset() for _ in range(slots))


def union_ann(a: Ann, b: Ann) -> Ann:
    """Slot-wise union ``P_a ∪ P_b`` (annotations of joined tuples)."""
    if len(a) != len(b):
        raise ValueError(f"annotation arity mismatch: {len(a)} != {len(b)}")
    return tuple(x | y for x, y in zip(a, b, strict=True))


class ZSet:
    """A consolidated Z-set of annotated rows."""

    __slots__ = ("_w",)

    def __init__(self, entries: Iterable[Entry] = ()) -> None:
        self._w: dict[tuple[Row, Ann], int] = {}
        for row, ann, weight in entries:
            self.add(row, ann, weight)

    @classmethod
    def from_dict(cls, weights: dict[tuple[Row, Ann], int]) -> ZSet:
        """A Z-set owning ``weights`` (no copy): operators that build their output dict
        directly skip one :meth:`add` call per row. The caller guarantees no zero weight and
        does not touch the dict afterwards."""
        out = cls()
        out._w = weights
        return out

    def add(self, row: Row, ann: Ann, weight: int) -> None:
        """Adds ``weight`` to ``(row, ann)``; a resulting zero removes the entry."""
        if weight:
            weights = self._w
            key = (row, ann)
            w = weights.get(key, 0) + weight
            if w:
                weights[key] = w
            else:
                del weights[key]

    def extend(self, other: ZSet, scale: int = 1) -> None:
        """In place: ``self += scale * other``."""
        if not scale:
            return
        weights = self._w
        get = weights.get
        for key, w in other._w.items():
            w = get(key, 0) + w * scale
            if w:
                weights[key] = w
            else:
                del weights[key]

    def items(self) -> ItemsView[tuple[Row, Ann], int]:
        """``(row, ann) -> weight`` as a read-only view: tight loops iterate it instead of
        :meth:`__iter__`, which builds an :data:`Entry` tuple per row through a generator."""
        return self._w.items()

    def weight(self, row: Row, ann: Ann) -> int:
        return self._w.get((row, ann), 0)

    def __iter__(self) -> Iterator[Entry]:
        for (row, ann), w in self._w.items():
            yield row, ann, w

    def __len__(self) -> int:
        return len(self._w)

    def __bool__(self) -> bool:
        return bool(self._w)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ZSet) and self._w == other._w

    def __hash__(self) -> int:  # mutable: identity hash would be misleading
        raise TypeError("ZSet is unhashable")

    def __add__(self, other: ZSet) -> ZSet:
        out = self.copy()
        out.extend(other)
        return out

    def __sub__(self, other: ZSet) -> ZSet:
        out = self.copy()
        out.extend(other, -1)
        return out

    def __neg__(self) -> ZSet:
        return ZSet((r, a, -w) for r, a, w in self)

    def copy(self) -> ZSet:
        out = ZSet()
        out._w = dict(self._w)
        return out

    def is_positive(self) -> bool:
        """True when every weight is > 0 (a bag, e.g. an integrated relation)."""
        return all(w > 0 for w in self._w.values())

    def rows(self) -> dict[Row, int]:
        """Weights summed per row, annotations dropped (zero sums removed)."""
        out: dict[Row, int] = {}
        for (row, _ann), w in self._w.items():
            s = out.get(row, 0) + w
            if s:
                out[row] = s
            else:
                out.pop(row, None)
        return out

    def __repr__(self) -> str:
        body = ", ".join(f"{r}{sorted(map(sorted, a))}:{w:+d}" for r, a, w in self)
        return f"ZSet({body})"
