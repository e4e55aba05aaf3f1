"""Interleaved A/B of a HAVING test on a group's accumulators: the maintenance benchmark's
aggs-10 shape (``sum, avg, max, count, sum, avg, max, sum, avg, max``, OR-ed comparisons
``>=`` each at its 99.7 % quantile, so that about 3 % of the groups pass) on 2,000 groups of
10 to 40 rows, as a connective of one test per comparison (before session 37) and as
``grouptest._flat_connective`` (after: each comparison inline, a sum or count read from its
fields). Prints the medians per group and their ratio."""

from __future__ import annotations

import random
import statistics
import time
from decimal import Decimal

from sketches.ivm.expr import Cmp, Col, Const, Or
from sketches.ivm.ops.accumulators import make_accumulator
from sketches.ivm.ops.grouptest import compile_group_test
from sketches.ivm.ops.select import connective

FUNCS = ("sum", "avg", "max", "count_star", "sum", "avg", "max", "sum", "avg", "max")
GROUPS, ROUNDS = 2000, 41
rng = random.Random(7)
groups = []
for g in range(GROUPS):
    accs = [make_accumulator(f, None) for f in FUNCS]
    for _ in range(rng.randint(10, 40)):
        for f, acc in zip(FUNCS, accs, strict=True):
            acc.add(1 if f == "count_star" else rng.randint(0, 10_000), 1)
    groups.append(((g,), accs))
quantile = int(GROUPS * (1 - 0.03 / len(FUNCS)))
consts = []
for i in range(len(FUNCS)):
    results = sorted(view[1][i].result() for view in groups)  # type: ignore[type-var]
    c = results[quantile]
    consts.append(Decimal(c).quantize(Decimal("0.01")) if isinstance(c, Decimal) else c)
having = Or(tuple(Cmp(">=", Col(1 + i), Const(c)) for i, c in enumerate(consts)))
after = compile_group_test(having, 1, FUNCS)
leaves = [compile_group_test(a, 1, FUNCS) for a in having.args]
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
for name, ts in times.items():
    print(f"{name:7s} {statistics.median(ts[1:]) * 1e6:.3f} us per group")
ratio = statistics.median(times["after"][1:]) / statistics.median(times["before"][1:])
print(f"after/before {ratio:.2f} ({passing} of {GROUPS} groups pass)")
