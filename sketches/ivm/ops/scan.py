"""Scan / annotate (IMP §5.2.1, Def. 4.4).

Input: delta rows of one table whose column ``frag_col`` holds the row's fragment id, computed
in SQL by :mod:`sketches.deltas` (``width_bucket`` over the typed bounds; NULL → n+1), so Python
never compares values of the sketch attribute. Output: the row without that column, annotated
``{frag}`` in the table's slot and ``{}`` in every other slot (``{}`` everywhere for a table
without a sketch), with the input multiplicity.

Delta rule: the annotation of a tuple depends on the tuple alone, so annotating is linear:
``annotate(R + ΔR) = annotate(R) + annotate(ΔR)``; the operator is stateless.
"""

from __future__ import annotations

from sketches.ivm.operator import Operator
from sketches.ivm.zset import Ann, ZSet


class Scan(Operator):
    kind = "scan"

    def __init__(self, slots: int, slot: int | None = None, frag_col: int | None = None) -> None:
        if (slot is None) != (frag_col is None):
            raise ValueError("slot and frag_col go together")
        self.slots = slots
        self.slot = slot
        self.frag_col = frag_col
        self._anns: dict[int, Ann] = {}

    def step(self, delta: ZSet) -> ZSet:
        out = ZSet()
        for row, _ann, w in delta:
            out.add(*self.annotate(row), w)
        return out

    def annotate(self, row: tuple[object, ...]) -> tuple[tuple[object, ...], Ann]:
        if self.slot is None or self.frag_col is None:
            return row, tuple(frozenset() for _ in range(self.slots))
        frag = row[self.frag_col]
        if not isinstance(frag, int):
            raise TypeError(f"fragment id must be an int, got {frag!r}")
        ann = self._anns.get(frag)
        if ann is None:   # one annotation per fragment, shared by its rows (immutable)
            ann = self._anns[frag] = tuple(frozenset((frag,)) if i == self.slot else frozenset()
                                           for i in range(self.slots))
        return row[:self.frag_col] + row[self.frag_col + 1:], ann
