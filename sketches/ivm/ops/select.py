"""Selection σθ (IMP §5.2.3).

Delta rule: σ is linear, ``σ(R + ΔR) = σ(R) + σ(ΔR)``; a passing tuple keeps its annotation
(its own provenance suffices to produce it) and multiplicity. Stateless. In a pipeline whose
subtree below the selection is stateless the predicate is pushed into the delta fetch instead
(:mod:`sketches.deltas`); this operator evaluates Python :mod:`sketches.ivm.expr` predicates.
"""

from __future__ import annotations

from sketches.ivm.expr import Expr, holds
from sketches.ivm.operator import Operator
from sketches.ivm.zset import ZSet


class Select(Operator):
    kind = "select"

    def __init__(self, predicate: Expr) -> None:
        self.predicate = predicate

    def step(self, delta: ZSet) -> ZSet:
        return ZSet((row, ann, w) for row, ann, w in delta if holds(self.predicate, row))
