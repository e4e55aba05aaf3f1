"""Selection σθ (IMP §5.2.3).

Delta rule: σ is linear, ``σ(R + ΔR) = σ(R) + σ(ΔR)``; a passing tuple keeps its annotation
(its own provenance suffices to produce it) and multiplicity. Stateless. In a pipeline whose
subtree below the selection is stateless the predicate is pushed into the delta fetch instead
(:mod:`sketches.deltas`); this operator evaluates Python :mod:`sketches.ivm.expr` predicates.
"""

from __future__ import annotations

from sketches.ivm.expr import Expr
from sketches.ivm.operator import Operator
from sketches.ivm.zset import ZSet


class Select(Operator):
    kind = "select"

    def __init__(self, predicate: Expr) -> None:
        self.predicate = predicate

    def step(self, delta: ZSet) -> ZSet:
        # holds() inlined: `eval(row) is True`; a filtered consolidated dict stays consolidated
        test = self.predicate.eval
        return ZSet.from_dict({key: w for key, w in delta.items() if test(key[0]) is True})
