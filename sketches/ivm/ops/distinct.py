"""DISTINCT δ: aggregation grouping on every column with no aggregate function (IMP §4).

Delta rule: that of :class:`~sketches.ivm.ops.aggregate.Aggregate` with ``G`` = all columns: a
row is in the output while its input multiplicity is > 0, annotated with the union of the
annotations of all its duplicates (``F_g`` counts them, so deleting one duplicate keeps the
fragments the others still need). A touched row emits ``−(t, P_old)`` / ``+(t, P_new)``, which
cancel when neither existence nor ``P`` changed.
"""

from __future__ import annotations

from sketches.ivm.ops.aggregate import Aggregate


class Distinct(Aggregate):
    kind = "distinct"

    def __init__(self, width: int, slots: int) -> None:
        super().__init__(group_by=tuple(range(width)), aggs=(), slots=slots)
