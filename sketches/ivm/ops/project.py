"""Projection π (bag semantics, no duplicate elimination; IMP §5.2.2).

Delta rule: π is linear, ``π(R + ΔR) = π(R) + π(ΔR)``; each output tuple is produced by one
input tuple, so it keeps that tuple's annotation and multiplicity. Tuples that become equal after
projection (same row, same annotation) are merged by the Z-set; with different annotations they
stay apart, as in the bag of annotated tuples. Stateless.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import cast

from sketches.ivm.expr import Col, Expr
from sketches.ivm.operator import Operator
from sketches.ivm.zset import Ann, Row, ZSet


class Project(Operator):
    kind = "project"

    def __init__(self, exprs: Sequence[Expr | int]) -> None:
        self.exprs: tuple[Expr, ...] = tuple(Col(e) if isinstance(e, int) else e for e in exprs)
        self.project_row = _projection(self.exprs)
        """The projection of one row (for an operator that takes it row by row)."""

    def step(self, delta: ZSet) -> ZSet:
        project = self.project_row
        out: dict[tuple[Row, Ann], int] = {}
        get = out.get
        for (row, ann), w in delta.items():
            key = (project(row), ann)
            s = get(key, 0) + w
            if s:
                out[key] = s
            else:
                del out[key]
        return ZSet.from_dict(out)


def _projection(exprs: tuple[Expr, ...]) -> Callable[[Row], Row]:
    """``row -> tuple(e.eval(row) for e in exprs)``; plain column lists (the common case)
    become an :func:`itemgetter` instead of one Python call per column and row."""
    if exprs and all(type(e) is Col for e in exprs):
        cols = [cast(Col, e).index for e in exprs]
        if len(cols) == 1:
            col = cols[0]
            return lambda row: (row[col],)
        return cast(Callable[[Row], Row], itemgetter(*cols))
    evals = [e.eval for e in exprs]
    return lambda row: tuple([ev(row) for ev in evals])
