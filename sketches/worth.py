"""Is skipping worth it? The instrumented query against the original, by PostgreSQL's plan.

Why: a sketch that keeps many scattered fragments adds an OR of many ranges that PostgreSQL
evaluates on every row it still reads, and can change the plan for the worse; the added cost
may also push the plan over ``jit_above_cost``. Found in session 29 (a helper's search for
queries the proxy slows down): a sketch of 518 of 1,001 fragments in 73 ranges made a
1M-row HAVING query 1.8× slower than PostgreSQL alone, one of 851 fragments 3.5× slower,
and a 5,000-value IN list with a sketch of 455 fragments 6.25× slower (a bitmap scan instead
of a sequential one, and 318 ms of JIT). The planner saw each coming: the instrumented plan
cost 4–13× the original's, or switched JIT on. So a sketch is not used where PostgreSQL plans
the instrumented query far costlier than the original, or compiles it where it would not
compile the original.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from sketches.cost import explain

log = logging.getLogger(__name__)


MAX_COST_RATIO = 3.0
"""The instrumented plan may cost up to this many times the original's. Why not 1: on a
small table the filter's checks can outweigh what it skips in the estimate (up to 2× in the
test suite's tables) where the difference is small in time; the slow-downs found came with
4–13× the cost, or with JIT."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """``pays``: skipping may pay: the instrumented plan costs at most
    :data:`MAX_COST_RATIO` times the original's and is not JIT-compiled where the original
    is not (or a plan is unknown: EXPLAIN failed, and skipping keeps its old default); the
    two costs and JIT uses, for the reason."""

    pays: bool
    original: float | None
    instrumented: float | None
    jit: bool = False

    @property
    def reason(self) -> str:
        why = "switches JIT on" if self.jit else "makes the plan costlier"
        return (f"the sketch's filter {why} ({self.instrumented:,.0f} vs "
                f"{self.original:,.0f}): original forwarded")


def compare(conn: psycopg.Connection[Any], original: str, instrumented: str,
            params: Sequence[object] | None) -> Verdict:
    """Both queries planned (not run) in ``conn``'s transaction, with ``params``."""
    before = explain(conn, original, params)
    after = explain(conn, instrumented, params) if before is not None else None
    if before is None or after is None:
        return Verdict(True, None, None)
    cost, base = float(after["Plan"]["Total Cost"]), float(before["Plan"]["Total Cost"])
    jit = "JIT" in after and "JIT" not in before
    return Verdict(cost <= base * MAX_COST_RATIO and not jit, base, cost, jit)
