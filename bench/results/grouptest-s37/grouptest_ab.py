"""Interleaved A/B of a HAVING test on a group's accumulators: an OR of ten ``>=``
comparisons, each at its 99.7 % quantile (about 3 % of the groups pass, as in the
maintenance benchmark's aggs-10 shape), on 2,000 groups of 10 to 40 rows, as a connective of
one test per comparison (before session 37) and as ``grouptest._flat_connective`` (after:
each comparison inline, a sum or count read from its fields). Two mixes of aggregates: the
benchmark's aggs-10 (``sum, avg, max, count(*), sum, avg, max, sum, avg, max``) and sums and
counts only. Prints the medians per group and their ratio for each."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from decimal import Decimal

from sketches.ivm.expr import Cmp, Col, Const, Or
from sketches.ivm.ops.accumulators import make_accumulator
from sketches.ivm.ops.grouptest import compile_group_test
from sketches.ivm.ops.select import connective

MIXES = {"aggs-10": ("sum", "avg", "max", "count_star", "sum", "avg", "max", "sum", "avg",
                     "max"),
         "sums and counts": ("sum", "count_star", "sum", "count", "sum", "sum", "count",
                             "sum", "sum", "count")}
GROUPS, ROUNDS = 2000, 41


def run(funcs: Sequence[str]) -> None:
    rng = random.Random(7)
    groups = []
    for g in range(GROUPS):
        accs = [make_accumulator(f, None) for f in funcs]
        for _ in range(rng.randint(10, 40)):
            for f, acc in zip(funcs, accs, strict=True):
                acc.add(1 if f == "count_star" else rng.randint(0, 10_000), 1)
        groups.append(((g,), accs))
    quantile = int(GROUPS * (1 - 0.03 / len(funcs)))
    consts = []
    for i in range(len(funcs)):
        results = sorted(view[1][i].result() for view in groups)  # type: ignore[type-var]
        c = results[quantile]
        consts.append(Decimal(c).quantize(Decimal("0.01")) if isinstance(c, Decimal) else c)
    having = Or(tuple(Cmp(">=", Col(1 + i), Const(c)) for i, c in enumerate(consts)))
    after = compile_group_test(having, 1, funcs)
    leaves = [compile_group_test(a, 1, funcs) for a in having.args]
    assert after is not None and all(leaf is not None for leaf in leaves)
    before = connective(leaves, True)  # type: ignore[arg-type]
    assert [after(v) for v in groups] == [before(v) for v in groups]
    times: dict[str, list[float]] = {"before": [], "after": []}
    for r in range(ROUNDS):
        order = [("before", before), ("after", after)]
        for name, test in (order if r % 2 else order[::-1]):
            t0 = time.perf_counter()
            for view in groups:
                test(view)
            times[name].append((time.perf_counter() - t0) / GROUPS)
    passing = sum(after(v) is True for v in groups)
    medians = {name: statistics.median(ts[1:]) for name, ts in times.items()}
    print(f"{' '.join(funcs)}: before {medians['before'] * 1e6:.3f} us, after"
          f" {medians['after'] * 1e6:.3f} us per group, after/before"
          f" {medians['after'] / medians['before']:.2f} ({passing} of {GROUPS} groups pass)")


for mix in MIXES.values():
    run(mix)
