"""Comparing a query's answer through the proxy with PostgreSQL's own answer.

Rows are compared as multisets, or as sequences when the query's ORDER BY fixes the order.
Integers, numerics, text and dates compare exactly. float8 values compare after rounding to 12
significant digits: a sketch changes the plan and therefore the order in which a float sum is
accumulated, which changes the last bits without changing the answer. (The query templates
aggregate integer columns, whose sums are exact, so this only matters for ad-hoc queries.)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

FLOAT_DIGITS = 12


def _norm(v: object) -> object:
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v) or v == 0.0:
            return v
        return float(f"{v:.{FLOAT_DIGITS - 1}e}")
    return v


def normalize(rows: Sequence[Sequence[object]]) -> list[tuple[object, ...]]:
    return [tuple(_norm(v) for v in row) for row in rows]


@dataclass(frozen=True, slots=True)
class Comparison:
    equal: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"equal": self.equal, "detail": self.detail}


def compare(got: Sequence[Sequence[object]], want: Sequence[Sequence[object]],
            ordered: bool) -> Comparison:
    """``got`` (through the proxy) against ``want`` (PostgreSQL directly)."""
    g, w = normalize(got), normalize(want)
    if ordered:
        if g == w:
            return Comparison(True, "")
        first = next((i for i, (x, y) in enumerate(zip(g, w, strict=False)) if x != y),
                     min(len(g), len(w)))
        return Comparison(False, f"ordered: {len(g)} vs {len(w)} rows, first difference at "
                                 f"row {first}: {g[first:first + 1]} vs {w[first:first + 1]}")
    cg, cw = Counter(g), Counter(w)
    if cg == cw:
        return Comparison(True, "")
    extra, missing = cg - cw, cw - cg
    return Comparison(False, f"multiset: {len(g)} vs {len(w)} rows; "
                             f"{sum(extra.values())} extra e.g. {list(extra)[:3]}, "
                             f"{sum(missing.values())} missing e.g. {list(missing)[:3]}")
