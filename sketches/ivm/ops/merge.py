"""Merge (the root; IMP §5.1): from annotated result deltas to a sketch delta.

State: per slot a counter ``C[f]`` = the number of result tuples (with multiplicity) whose
annotation contains ``f``. The sketch is ``{f | C[f] > 0}`` per slot.

Delta rule: ``C'[f] = C[f] + Σ_{(t,P,m) ∈ ΔQ, f ∈ P} m``; the sketch delta adds the fragments
whose count went from 0 to > 0 and removes those that went from > 0 to 0. Fragments whose
count stays positive are unchanged (the sketch is a set).
"""

from __future__ import annotations

from dataclasses import dataclass

from sketches.ivm.codec import Json
from sketches.ivm.errors import InconsistentDelta
from sketches.ivm.operator import check_kind
from sketches.ivm.zset import Ann, ZSet


@dataclass(frozen=True, slots=True)
class SketchDelta:
    """Fragments added to / removed from the sketch, one set per slot (sketched table)."""

    added: tuple[frozenset[int], ...]
    removed: tuple[frozenset[int], ...]

    @property
    def empty(self) -> bool:
        return not any(self.added) and not any(self.removed)


class Merge:
    kind = "merge"

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.counts: list[dict[int, int]] = [{} for _ in range(slots)]

    def step(self, delta: ZSet) -> SketchDelta:
        changes: list[dict[int, int]] = [{} for _ in range(self.slots)]
        for ann, w in _weights_per_ann(delta).items():
            if w:
                for ch, frags in zip(changes, ann, strict=True):
                    for f in frags:
                        ch[f] = ch.get(f, 0) + w
        return self.apply(changes)

    def apply(self, changes: list[dict[int, int]]) -> SketchDelta:
        """Adds ``changes[slot][f]`` to the count of fragment ``f`` of each slot."""
        added: list[set[int]] = [set() for _ in range(self.slots)]
        removed: list[set[int]] = [set() for _ in range(self.slots)]
        for slot, ch in enumerate(changes):
            counts = self.counts[slot]
            for f, d in ch.items():
                if d and count_fragment(counts, f, d):
                    (added if f in counts else removed)[slot].add(f)
        return SketchDelta(tuple(frozenset(s) for s in added),
                           tuple(frozenset(s) for s in removed))

    def sketch(self) -> tuple[frozenset[int], ...]:
        return tuple(frozenset(c) for c in self.counts)

    def snapshot(self) -> dict[str, Json]:
        return {"kind": self.kind, "counts": [sorted(c.items()) for c in self.counts]}

    def restore(self, state: dict[str, Json]) -> None:
        check_kind(self.kind, state)
        self.counts = [{int(f): int(c) for f, c in slot} for slot in state["counts"]]


def _weights_per_ann(delta: ZSet) -> dict[Ann, int]:
    """Weights summed per annotation: the counters are linear in the weights, and an
    aggregate's ``−old +new`` pair of a group whose fragments did not change shares one
    annotation object, which cancels here instead of costing a counter update per fragment."""
    out: dict[Ann, int] = {}
    get = out.get
    for (_row, ann), w in delta.items():
        out[ann] = get(ann, 0) + w
    return out


def count_fragment(counter: dict[int, int], f: int, change: int) -> bool:
    """Adds ``change`` to fragment ``f``'s count; True when ``f`` appeared or disappeared."""
    before = counter.get(f, 0)
    c = before + change
    if c < 0:
        raise InconsistentDelta(f"fragment {f} counted below zero")
    if c:
        counter[f] = c
    elif before:
        del counter[f]
    return (before == 0) != (c == 0)
