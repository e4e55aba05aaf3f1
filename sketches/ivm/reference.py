"""Naive, non-incremental twins of the incremental operators: the test oracle.

Each function evaluates its operator from scratch on a whole (integrated) annotated bag, with
the plainest code possible (sorting, grouping, Python builtins) and none of the incremental
state. The contract the tests check: integrating an incremental operator's output deltas gives
what its twin computes on the integrated input.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from functools import cmp_to_key, reduce
from typing import Any

from sketches.ivm import numeric
from sketches.ivm.expr import Expr, holds
from sketches.ivm.ops.accumulators import pg_numeric_div
from sketches.ivm.ops.aggregate import AggSpec
from sketches.ivm.ops.topk import OrderItem
from sketches.ivm.zset import Ann, Row, ZSet, union_ann


def _bag(rel: ZSet) -> list[tuple[Row, Ann, int]]:
    if not rel.is_positive():
        raise ValueError("reference operators take bags (positive weights)")
    return list(rel)


def scan(rows: Sequence[tuple[Row, int]], slots: int, slot: int | None,
         frag: Callable[[Row], int] | None) -> ZSet:
    out = ZSet()
    for row, m in rows:
        ann = tuple(frozenset((frag(row),)) if frag is not None and i == slot else frozenset()
                    for i in range(slots))
        out.add(row, ann, m)
    return out


def select(rel: ZSet, predicate: Expr) -> ZSet:
    return ZSet(e for e in _bag(rel) if holds(predicate, e[0]))


def project(rel: ZSet, exprs: Sequence[Expr]) -> ZSet:
    return ZSet((tuple(x.eval(r) for x in exprs), a, m) for r, a, m in _bag(rel))


def join(left: ZSet, right: ZSet, left_key: Sequence[int], right_key: Sequence[int]) -> ZSet:
    out = ZSet()
    for lr, la, lm in _bag(left):
        for rr, ra, rm in _bag(right):
            lk = [lr[i] for i in left_key]
            rk = [rr[i] for i in right_key]
            if None not in lk and lk == rk:
                out.add(lr + rr, union_ann(la, ra), lm * rm)
    return out


def _aggregate_value(func: str, values: list[object], count: int) -> object:
    present = [v for v in values if v is not None]
    if func == "count_star":
        return count
    if func == "count":
        return len(present)
    if not present:
        return None
    if func == "sum":
        return reduce(numeric.add, present)
    if func == "avg":
        total: Any = reduce(numeric.add, present)
        if isinstance(total, float):
            return total / len(present)
        return pg_numeric_div(total, len(present))
    if func == "min":
        return min(present)  # type: ignore[type-var]
    if func == "max":
        return max(present)  # type: ignore[type-var]
    raise ValueError(func)


def aggregate(rel: ZSet, group_by: Sequence[int], aggs: Sequence[AggSpec], slots: int,
              scalar: bool = False) -> ZSet:
    groups: dict[Row, list[tuple[Row, Ann, int]]] = defaultdict(list)
    for row, a0, m in _bag(rel):
        groups[tuple(row[i] for i in group_by)].append((row, a0, m))
    if scalar:
        groups.setdefault((), [])
    out = ZSet()
    for key, members in groups.items():
        count = sum(m for _r, _a, m in members)
        values = []
        for spec in aggs:
            expanded = [None if spec.arg is None else r[spec.arg]
                        for r, _a, m in members for _ in range(m)]
            values.append(_aggregate_value(spec.func, expanded, count))
        ann: Ann = tuple(frozenset() for _ in range(slots))
        for _r, a, _m in members:
            ann = union_ann(ann, a)
        out.add(key + tuple(values), ann, 1)
    return out


def distinct(rel: ZSet, width: int, slots: int) -> ZSet:
    return aggregate(rel, tuple(range(width)), (), slots)


def _compare(a: Row, b: Row, order: Sequence[OrderItem]) -> int:
    for item in order:
        x, y = a[item.col], b[item.col]
        if x is None and y is None:
            continue
        if x is None or y is None:
            null_first = item.nulls_go_first
            return (-1 if null_first else 1) if x is None else (1 if null_first else -1)
        if x == y:
            continue
        less = x < y  # type: ignore[operator]
        return (1 if less else -1) if item.descending else (-1 if less else 1)
    return 0


def topk(rel: ZSet, order: Sequence[OrderItem], k: int) -> ZSet:
    """First k tuples in O-order plus all tuples tied with the k-th (WITH TIES)."""
    expanded: list[tuple[Row, Ann]] = [(r, a) for r, a, m in _bag(rel) for _ in range(m)]

    def cmp(x: tuple[Row, Ann], y: tuple[Row, Ann]) -> int:
        return _compare(x[0], y[0], order)

    expanded.sort(key=cmp_to_key(cmp))
    if len(expanded) > k:
        kth = expanded[k - 1][0]
        expanded = [e for i, e in enumerate(expanded)
                    if i < k or _compare(e[0], kth, order) == 0]
    out = ZSet()
    for r, a in expanded:
        out.add(r, a, 1)
    return out


def merge(rel: ZSet, slots: int) -> tuple[frozenset[int], ...]:
    sketch: list[set[int]] = [set() for _ in range(slots)]
    for _r, ann, _m in _bag(rel):
        for slot, frags in enumerate(ann):
            sketch[slot] |= frags
    return tuple(frozenset(s) for s in sketch)
