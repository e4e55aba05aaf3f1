"""Projection π (bag semantics, no duplicate elimination; IMP §5.2.2).

Delta rule: π is linear, ``π(R + ΔR) = π(R) + π(ΔR)``; each output tuple is produced by one
input tuple, so it keeps that tuple's annotation and multiplicity. Tuples that become equal after
projection (same row, same annotation) are merged by the Z-set; with different annotations they
stay apart, as in the bag of annotated tuples. Stateless.
"""

from __future__ import annotations

from collections.abc import Sequence

from sketches.ivm.expr import Col, Expr
from sketches.ivm.operator import Operator
from sketches.ivm.zset import ZSet


class Project(Operator):
    kind = "project"

    def __init__(self, exprs: Sequence[Expr | int]) -> None:
        self.exprs: tuple[Expr, ...] = tuple(Col(e) if isinstance(e, int) else e for e in exprs)

    def step(self, delta: ZSet) -> ZSet:
        return ZSet((tuple(e.eval(row) for e in self.exprs), ann, w) for row, ann, w in delta)
