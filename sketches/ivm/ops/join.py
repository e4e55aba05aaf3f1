"""Equi-join R ⋈ S (IMP §5.2.4, DESIGN §7).

Delta rule. With ``R' = R + ΔR`` and ``S' = S + ΔS`` and ⋈ bilinear over Z-sets::

    R'⋈S' − R⋈S = (R + ΔR)⋈S' − R⋈(S' − ΔS)
                = ΔR⋈S' + R⋈ΔS
                = ΔR⋈S' + (R' − ΔR)⋈ΔS
                = ΔR⋈S' + R'⋈ΔS − ΔR⋈ΔS

so the operator needs the *current* (new) inputs only where they join delta rows. They come from
a :class:`JoinBackend`: PostgreSQL holds R', S' in a pipeline (the backend fetches the partners of
the delta's join keys in the maintenance snapshot), :class:`InMemoryJoinBackend` keeps both sides
as Z-sets (tests, small inputs). ``ΔR⋈ΔS`` is computed in memory. A joined tuple is annotated
``P_r ∪ P_s`` with multiplicity ``m_r·m_s``: it needs both inputs, and the product of weights
covers the four insert/delete cases (−·− = +). Rows with a NULL join key never join.

Output rows are ``left row + right row``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, cast

from sketches.ivm.codec import Json, decode_zset, encode_zset
from sketches.ivm.errors import NotMaintainable
from sketches.ivm.operator import check_kind
from sketches.ivm.zset import Entry, Row, ZSet, union_ann

Key = tuple[object, ...]


class JoinBackend(Protocol):
    """Where the current inputs R' and S' of a join live."""

    def advance(self, left: ZSet, right: ZSet) -> None:
        """Called first in every step with the batch's deltas: make R', S' current."""

    def left_matching(self, keys: set[Key]) -> ZSet:
        """The rows of R' whose join key is in ``keys``."""

    def right_matching(self, keys: set[Key]) -> ZSet:
        """The rows of S' whose join key is in ``keys``."""


def key_of(row: Row, cols: Sequence[int]) -> Key | None:
    key = tuple(row[c] for c in cols)
    return None if any(v is None for v in key) else key


def key_function(cols: Sequence[int]) -> Callable[[Row], Key | None]:
    """:func:`key_of` bound to ``cols``; a single join column (the common case) gets a closure
    without the per-row generators."""
    if len(cols) != 1:
        cols = tuple(cols)
        return lambda row: key_of(row, cols)
    col = cols[0]

    def key(row: Row) -> Key | None:
        v = row[col]
        return None if v is None else (v,)
    return key


class InMemoryJoinBackend:
    """Both join inputs integrated in memory (state: two Z-sets)."""

    kind = "join_memory"

    def __init__(self, left_key: Sequence[int], right_key: Sequence[int]) -> None:
        self.left_key = tuple(left_key)
        self.right_key = tuple(right_key)
        self.left = ZSet()
        self.right = ZSet()

    def advance(self, left: ZSet, right: ZSet) -> None:
        self.left.extend(left)
        self.right.extend(right)

    def left_matching(self, keys: set[Key]) -> ZSet:
        return ZSet(e for e in self.left if key_of(e[0], self.left_key) in keys)

    def right_matching(self, keys: set[Key]) -> ZSet:
        return ZSet(e for e in self.right if key_of(e[0], self.right_key) in keys)

    def snapshot(self) -> dict[str, Json]:
        return {"kind": self.kind, "left": encode_zset(self.left),
                "right": encode_zset(self.right)}

    def restore(self, state: dict[str, Json]) -> None:
        check_kind(self.kind, state)
        self.left = decode_zset(state["left"])
        self.right = decode_zset(state["right"])


def hash_join(left: Iterable[Entry], right: Iterable[Entry], left_key: Sequence[int],
              right_key: Sequence[int]) -> ZSet:
    """``left ⋈ right`` on the key columns: rows concatenated, P united, weights multiplied."""
    index: dict[Key, list[Entry]] = defaultdict(list)
    rkey = key_function(right_key)
    for entry in right:
        k = rkey(entry[0])
        if k is not None:
            index[k].append(entry)
    out = ZSet()
    lkey = key_function(left_key)
    for lrow, lann, lw in left:
        k = lkey(lrow)
        if k is None:
            continue
        for rrow, rann, rw in index.get(k, ()):
            out.add(lrow + rrow, union_ann(lann, rann), lw * rw)
    return out


class Join:
    """Binary incremental equi-join; ``step(ΔR, ΔS) -> Δ(R⋈S)``."""

    kind = "join"

    def __init__(self, left_key: Sequence[int], right_key: Sequence[int],
                 backend: JoinBackend) -> None:
        if len(left_key) != len(right_key) or not left_key:
            raise ValueError("join keys must be non-empty and of equal length")
        self.left_key = tuple(left_key)
        self.right_key = tuple(right_key)
        self.backend = backend

    def step(self, left: ZSet, right: ZSet) -> ZSet:
        self.backend.advance(left, right)
        out = ZSet()
        lkeys = _keys(left, self.left_key)
        rkeys = _keys(right, self.right_key)
        if lkeys:   # ΔR ⋈ S'
            out.extend(hash_join(left, self.backend.right_matching(lkeys),
                                 self.left_key, self.right_key))
        if rkeys:   # R' ⋈ ΔS
            out.extend(hash_join(self.backend.left_matching(rkeys), right,
                                 self.left_key, self.right_key))
        if lkeys & rkeys:   # − ΔR ⋈ ΔS
            out.extend(hash_join(left, right, self.left_key, self.right_key), -1)
        return out

    def snapshot(self) -> dict[str, Json]:
        snap = getattr(self.backend, "snapshot", None)
        return {"kind": self.kind, "backend": snap() if snap else None}

    def restore(self, state: dict[str, Json]) -> None:
        check_kind(self.kind, state)
        restore = getattr(self.backend, "restore", None)
        if restore is not None and state.get("backend") is not None:
            restore(state["backend"])


def _keys(delta: ZSet, cols: Sequence[int]) -> set[Key]:
    """The non-NULL join keys of the rows of ``delta``. A key holding NaN is refused:
    PostgreSQL's NaN equals NaN, Python's never does, so its rows would join no partner
    (the partners a delta key finds come from its own rows' keys, so checking the deltas'
    keys covers every join)."""
    key = key_function(cols)
    keys = {key(row) for (row, _ann), _w in delta.items()}
    keys.discard(None)
    found = cast(set[Key], keys)
    if any(v != v for k in found for v in k):
        raise NotMaintainable("a NaN join key is not maintained")
    return found
