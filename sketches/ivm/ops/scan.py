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
from sketches.ivm.zset import Ann, Row, ZSet, empty_ann


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
        # builds the output dict in place: annotate() and ZSet.add per row were most of the cost
        out: dict[tuple[Row, Ann], int] = {}
        get = out.get
        col = self.frag_col
        anns = self._anns
        empty = empty_ann(self.slots)
        for (row, _a), w in delta.items():
            if col is None:
                key = (row, empty)
            else:
                frag = row[col]
                ann = anns.get(frag) if type(frag) is int else None
                if ann is None:
                    ann = self._ann_of(frag)
                key = (row[:col] + row[col + 1:], ann)
            s = get(key, 0) + w
            if s:
                out[key] = s
            else:
                del out[key]
        return ZSet.from_dict(out)

    def _ann_of(self, frag: object) -> Ann:
        """The annotation of fragment ``frag``, one per fragment shared by its rows (immutable)."""
        if not isinstance(frag, int):
            raise TypeError(f"fragment id must be an int, got {frag!r}")
        ann = self._anns.get(frag)
        if ann is None:
            ann = self._anns[frag] = tuple(frozenset((frag,)) if i == self.slot else frozenset()
                                           for i in range(self.slots))
        return ann
