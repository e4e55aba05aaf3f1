"""Incremental operators vs their naive twins (sketches.ivm.reference) on random delta
sequences: after every batch the integrated output of the incremental operator equals the twin
evaluated on the integrated input, annotations included; state survives a JSON round trip."""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sketches.ivm import reference as ref
from sketches.ivm.errors import BufferExhausted
from sketches.ivm.expr import And, Arith, Cmp, Col, Const, Expr, IsNull, Not, Or
from sketches.ivm.ops.aggregate import Aggregate, AggSpec
from sketches.ivm.ops.distinct import Distinct
from sketches.ivm.ops.having import Having
from sketches.ivm.ops.join import InMemoryJoinBackend, Join
from sketches.ivm.ops.merge import Merge
from sketches.ivm.ops.project import Project
from sketches.ivm.ops.select import Select
from sketches.ivm.ops.topk import OrderItem, TopK, order_key
from sketches.ivm.zset import Ann, Row, ZSet

SETTINGS = settings(max_examples=60, deadline=None)
SLOTS = 2
maybe_int = st.one_of(st.none(), st.integers(-4, 4))
# rows: (g, v, d) — group key, int value, Decimal value
rows = st.tuples(st.one_of(st.none(), st.integers(0, 3)), maybe_int,
                 st.one_of(st.none(), st.decimals(-5, 5, places=1)))
anns = st.tuples(*[st.frozensets(st.integers(0, 5), max_size=2) for _ in range(SLOTS)])
# few groups, many values: bounded buffers fill up, trim and run dry
dense_rows = st.tuples(st.integers(0, 1), st.integers(-3, 3),
                       st.one_of(st.none(), st.decimals(-2, 2, places=0)))


def draw_batch(data: st.DataObject, bag: ZSet, row_st: st.SearchStrategy[Row] = rows,
               ann_st: st.SearchStrategy[Ann] = anns, max_inserts: int = 4) -> ZSet:
    """A random delta that keeps ``bag + delta`` a bag: inserts and deletes of present rows."""
    delta = ZSet()
    for _ in range(data.draw(st.integers(0, max_inserts), label="inserts")):
        delta.add(data.draw(row_st), data.draw(ann_st), data.draw(st.integers(1, 2)))
    present = sorted(bag, key=repr)
    if present:
        picks = data.draw(st.lists(st.sampled_from(range(len(present))), max_size=4,
                                   unique=True), label="deletes")
        for i in picks:
            r, a, w = present[i]
            delta.add(r, a, -data.draw(st.integers(1, w)))
    return delta


def roundtrip(op: Any, fresh: Callable[[], Any]) -> Any:
    """A freshly built operator restored from ``op``'s JSON-serialised snapshot."""
    other = fresh()
    other.restore(json.loads(json.dumps(op.snapshot())))
    return other


def run_unary(data: st.DataObject, make: Callable[[], Any], twin: Callable[[ZSet], ZSet],
              batches: int = 6) -> None:
    op = make()
    bag, out = ZSet(), ZSet()
    restart_at = data.draw(st.integers(0, batches), label="restart at")
    for i in range(batches):
        if i == restart_at:
            op = roundtrip(op, make)
        delta = draw_batch(data, bag)
        bag.extend(delta)
        out.extend(op.step(delta))
        assert out == twin(bag)


@SETTINGS
@given(st.data())
def test_select_and_having(data: st.DataObject) -> None:
    pred = Or((And((Cmp(">", Col(1), Const(0)), Not(IsNull(Col(0))))),
               Cmp("=", Arith("+", Col(1), Const(1)), Const(0))))
    run_unary(data, lambda: Select(pred), lambda bag: ref.select(bag, pred))
    run_unary(data, lambda: Having(pred), lambda bag: ref.select(bag, pred))


@SETTINGS
@given(st.data())
def test_project(data: st.DataObject) -> None:
    exprs = (Col(0), Arith("*", Col(1), Const(2)))
    run_unary(data, lambda: Project(exprs), lambda bag: ref.project(bag, exprs))


ALL_AGGS = (AggSpec("count_star"), AggSpec("count", 1), AggSpec("sum", 1), AggSpec("avg", 1),
            AggSpec("min", 1), AggSpec("max", 1), AggSpec("sum", 2), AggSpec("avg", 2),
            AggSpec("min", 2), AggSpec("max", 2))


@SETTINGS
@given(st.data(), st.booleans())
def test_aggregate_unbounded(data: st.DataObject, scalar: bool) -> None:
    group_by = () if scalar else (0,)
    run_unary(data, lambda: Aggregate(group_by, ALL_AGGS, SLOTS, scalar=scalar),
              lambda bag: ref.aggregate(bag, group_by, ALL_AGGS, SLOTS, scalar=scalar))


def best_values(bag: ZSet, key: Row, spec: AggSpec, limit: int) -> tuple[list[tuple[object, int]],
                                                                         bool]:
    """Exact refill from the integrated input: the best ``limit`` distinct values of a group."""
    counts: dict[object, int] = {}
    for r, _a, m in bag:
        assert spec.arg is not None
        if (r[0],) == key and r[spec.arg] is not None:
            counts[r[spec.arg]] = counts.get(r[spec.arg], 0) + m
    ordered = sorted(counts.items(), key=lambda kv: kv[0], reverse=spec.func == "max")
    return ordered[:limit], len(ordered) <= limit


@settings(max_examples=120, deadline=None)
@given(st.data(), st.integers(1, 3), st.booleans())
def test_aggregate_bounded_buffers(data: st.DataObject, limit: int, with_refill: bool) -> None:
    """Bounded min/max: with an exact refill the output equals the twin; without one the
    operator either equals the twin or raises BufferExhausted — it never guesses."""
    aggs = (AggSpec("min", 1), AggSpec("max", 1), AggSpec("count_star"))
    current = ZSet()
    refills: list[Row] = []

    def refill(key: Row, i: int) -> tuple[list[tuple[object, int]], bool]:
        refills.append(key)
        return best_values(current, key, aggs[i], limit)

    op = Aggregate((0,), aggs, SLOTS, buffer_limit=limit,
                   refill=refill if with_refill else None)
    out = ZSet()
    for _ in range(10):
        delta = draw_batch(data, current, row_st=dense_rows, max_inserts=6)
        current.extend(delta)
        try:
            out.extend(op.step(delta))
        except BufferExhausted:
            assert not with_refill
            return
        assert out == ref.aggregate(current, (0,), aggs, SLOTS)
        for st_ in op.groups.values():
            for acc in st_.accs:
                values = getattr(acc, "values", None)
                assert values is None or len(values) <= limit


@SETTINGS
@given(st.data())
def test_distinct(data: st.DataObject) -> None:
    run_unary(data, lambda: Distinct(3, SLOTS), lambda bag: ref.distinct(bag, 3, SLOTS))


ORDERS = st.lists(st.builds(OrderItem, st.sampled_from([0, 1, 2]), st.booleans(),
                            st.sampled_from([None, True, False])),
                  min_size=1, max_size=2)


@SETTINGS
@given(st.data(), ORDERS, st.integers(1, 4))
def test_topk_unbounded(data: st.DataObject, order: list[OrderItem], k: int) -> None:
    run_unary(data, lambda: TopK(order, k), lambda bag: ref.topk(bag, order, k))


def top_l(bag: ZSet, order: list[OrderItem], limit: int) -> tuple[list[tuple[Row, Ann, int]],
                                                                 bool]:
    """Exact top-l WITH TIES refill from the integrated input."""
    entries = sorted(bag, key=lambda e: order_key(e[0], order))
    taken, out = 0, []
    last = None
    for r, a, m in entries:
        key = order_key(r, order)
        if taken >= limit and key != last:
            return out, False
        out.append((r, a, m))
        taken += m
        last = key
    return out, True


@settings(max_examples=120, deadline=None)
@given(st.data(), ORDERS, st.integers(1, 3), st.integers(0, 3), st.booleans())
def test_topk_bounded(data: st.DataObject, order: list[OrderItem], k: int, extra: int,
                      with_refill: bool) -> None:
    limit = k + extra
    current = ZSet()
    op = TopK(order, k, buffer_limit=limit,
              refill=(lambda: top_l(current, order, limit)) if with_refill else None)
    out = ZSet()
    for _ in range(10):
        delta = draw_batch(data, current, row_st=dense_rows, max_inserts=6)
        current.extend(delta)
        try:
            out.extend(op.step(delta))
        except BufferExhausted:
            assert not with_refill
            return
        assert out == ref.topk(current, order, k)


@SETTINGS
@given(st.data())
def test_join_in_memory(data: st.DataObject) -> None:
    def make() -> Join:
        return Join((0,), (0,), InMemoryJoinBackend((0,), (0,)))

    op = make()
    left, right, out = ZSet(), ZSet(), ZSet()
    restart_at = data.draw(st.integers(0, 6))
    for i in range(6):
        if i == restart_at:
            op = roundtrip(op, make)
        dl, dr = draw_batch(data, left), draw_batch(data, right)
        left.extend(dl)
        right.extend(dr)
        out.extend(op.step(dl, dr))
        assert out == ref.join(left, right, (0,), (0,))


@SETTINGS
@given(st.data())
def test_merge(data: st.DataObject) -> None:
    op = Merge(SLOTS)
    bag = ZSet()
    sketch: list[set[int]] = [set() for _ in range(SLOTS)]
    for _ in range(6):
        delta = draw_batch(data, bag)
        bag.extend(delta)
        change = op.step(delta)
        for slot in range(SLOTS):
            assert not (change.added[slot] & change.removed[slot])
            assert change.added[slot].isdisjoint(sketch[slot])
            assert change.removed[slot] <= sketch[slot]
            sketch[slot] = (sketch[slot] | change.added[slot]) - change.removed[slot]
        assert tuple(frozenset(s) for s in sketch) == op.sketch() == ref.merge(bag, SLOTS)


@SETTINGS
@given(st.data(), st.integers(1, 3))
def test_composed_join_aggregate_having_topk_merge(data: st.DataObject, k: int) -> None:
    """scan⋈scan → γ → HAVING → top-k → merge, incremental vs naive, down to the sketch."""
    aggs = (AggSpec("count_star"), AggSpec("sum", 1), AggSpec("max", 4))
    having = Cmp(">=", Col(1), Const(1))
    order = [OrderItem(2, descending=True), OrderItem(0)]

    def naive(left: ZSet, right: ZSet) -> tuple[frozenset[int], ...]:
        joined = ref.join(left, right, (0,), (0,))
        agg = ref.aggregate(joined, (0,), aggs, SLOTS)
        return ref.merge(ref.topk(ref.select(agg, having), order, k), SLOTS)

    left_anns = st.tuples(st.frozensets(st.integers(0, 5), min_size=1, max_size=1),
                          st.just(frozenset[int]()))
    right_anns = st.tuples(st.just(frozenset[int]()),
                           st.frozensets(st.integers(0, 5), min_size=1, max_size=1))
    join = Join((0,), (0,), InMemoryJoinBackend((0,), (0,)))
    agg_op, having_op = Aggregate((0,), aggs, SLOTS), Having(having)
    top_op, merge_op = TopK(order, k), Merge(SLOTS)
    left, right = ZSet(), ZSet()
    for _ in range(6):
        dl = draw_batch(data, left, ann_st=left_anns)
        dr = draw_batch(data, right, ann_st=right_anns)
        left.extend(dl)
        right.extend(dr)
        merge_op.step(top_op.step(having_op.step(agg_op.step(join.step(dl, dr)))))
        assert merge_op.sketch() == naive(left, right)


def test_aggregate_emits_one_pair_per_group_per_batch() -> None:
    op = Aggregate((0,), (AggSpec("sum", 1),), 1)
    a: Ann = (frozenset({1}),)
    op.step(ZSet([((1, 5), a, 1)]))
    out = op.step(ZSet([((1, 2), a, 1), ((1, 3), (frozenset({2}),), 1), ((1, 5), a, -1)]))
    assert sorted((r, w) for r, _a, w in out) == [((1, 5), -1), ((1, 5), 1)]
    assert {w: ann for _r, ann, w in out} == {-1: a, 1: (frozenset({1, 2}),)}


def test_decimal_sum_state_roundtrip() -> None:
    op = Aggregate((0,), (AggSpec("sum", 1), AggSpec("avg", 1)), 1)
    op.step(ZSet([(("x", Decimal("1.5")), (frozenset({0}),), 3)]))
    other = roundtrip(op, lambda: Aggregate((0,), (AggSpec("sum", 1), AggSpec("avg", 1)), 1))
    assert other.current_output() == op.current_output()
    with pytest.raises(ValueError):
        AggSpec("median", 1)


def as_partials(delta: ZSet, aggs: tuple[AggSpec, ...]) -> tuple[list[Any], list[Any]]:
    """``delta`` in the form PostgreSQL's pre-aggregated delta takes (``partials.parse``):
    per entry its fragments, count and each aggregate's partial; min/max as net value
    changes per (group, aggregate, value)."""
    parts, values = [], {}
    for row, ann, w in delta:
        key = (row[0],)
        frags = tuple((s, f) for s in range(SLOTS) for f in sorted(ann[s]))
        partial: list[object] = []
        for i, a in enumerate(aggs):
            v = None if a.arg is None else row[a.arg]
            if a.func == "count_star":
                partial.append(w)
            elif a.func == "count":
                partial.append(0 if v is None else w)
            elif a.func in ("sum", "avg"):
                partial.append((0, 0) if v is None else (v * w, w))
            else:
                partial.append(None)
                if v is not None:
                    values[key, i, v] = values.get((key, i, v), 0) + w
        parts.append((key, frags, w, partial))
    return parts, [(k, i, v, w) for (k, i, v), w in values.items() if w]


ON_ROWS = Or((Cmp(">", Col(3), Const(1)), IsNull(Col(5))))  # sum(v), min(v)
ON_GROUPS = Or((Cmp(">=", Col(4), Const(Decimal("0.5"))),    # avg(v), on the accumulators
                And((Cmp("<", Col(8), Const(Decimal("1.3"))), Cmp("<>", Col(6), Const(2))))))


@pytest.mark.parametrize("having", [ON_ROWS, ON_GROUPS], ids=["row-test", "group-test"])
@SETTINGS
@given(data=st.data())
def test_fused_aggregate_having_merge(having: Expr, data: st.DataObject) -> None:
    """``Aggregate.step_sketch`` + ``Merge.apply`` (HAVING fused, only the aggregates it reads
    computed) gives the sketch of the naive twin and of step_partials → HAVING → merge, also
    across a snapshot/restore (which forgets every group's remembered HAVING outcome); so do
    the further HAVING conditions it maintains on the same state (``others``), NULL-valued
    tests and no HAVING at all among them. The HAVING is tested on output rows, or on the
    accumulators (``sketches.ivm.ops.grouptest``: an AND/OR of comparisons with constants)."""
    others = (Cmp("<", Col(3), Const(3)), Cmp(">=", Col(5), Const(2)), None)
    test = Having(having)
    tests = [None if h is None else Having(h) for h in others]

    def make() -> Aggregate:
        return Aggregate((0,), ALL_AGGS, SLOTS)
    fused, twin = make(), make()
    fused_merges = [Merge(SLOTS) for _ in range(1 + len(others))]
    twin_merge = Merge(SLOTS)
    bag = ZSet()
    restart_at = data.draw(st.integers(0, 6), label="restart at")
    for i in range(6):
        if i == restart_at:
            fused = roundtrip(fused, make)
        delta = draw_batch(data, bag)
        bag.extend(delta)
        parts, values = as_partials(delta, ALL_AGGS)
        changes = fused.step_sketch(
            parts, values, (test.test, test.columns, test.predicate),
            [None if t is None else (t.test, t.columns, t.predicate) for t in tests])
        for merge, change in zip(fused_merges, changes, strict=True):
            merge.apply(change)
        twin_merge.step(test.step(twin.step_partials(parts, values)))
        output = ref.aggregate(bag, (0,), ALL_AGGS, SLOTS)
        naive = ref.merge(ref.select(output, having), SLOTS)
        assert fused_merges[0].sketch() == twin_merge.sketch() == naive
        for merge, h in zip(fused_merges[1:], others, strict=True):
            want = ref.merge(output if h is None else ref.select(output, h), SLOTS)
            assert merge.sketch() == want, h
