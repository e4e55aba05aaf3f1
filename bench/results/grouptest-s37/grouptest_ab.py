"""Interleaved A/B of a HAVING test on a group's accumulators: the OR of ten
``sum(x_i) >= c_i`` (the maintenance benchmark's aggs-10 shape) as a connective of one test
per comparison (before session 37) and as ``grouptest._flat_connective`` (after: each
comparison inline, a sum read from its fields), on 2,000 groups of which about 3 % pass, as
in the benchmark. Prints the medians per group and their ratio."""

from __future__ import annotations

import random
import statistics
import time

from sketches.ivm.expr import Cmp, Col, Const, Or
from sketches.ivm.ops.accumulators import make_accumulator
from sketches.ivm.ops.grouptest import compile_group_test
from sketches.ivm.ops.select import connective

N_AGGS, GROUPS, ROUNDS = 10, 2000, 41
rng = random.Random(7)
funcs = ["sum"] * N_AGGS
groups = []
for g in range(GROUPS):
    accs = [make_accumulator("sum", None) for _ in range(N_AGGS)]
    for acc in accs:
        acc.add(rng.randint(0, 1_000_000), 1)
    groups.append(((g,), accs))
having = Or(tuple(Cmp(">=", Col(1 + i), Const(997_000)) for i in range(N_AGGS)))
after = compile_group_test(having, 1, funcs)
before = connective([compile_group_test(a, 1, funcs) for a in having.args], True)
assert after is not None and all(f is not None for f in [before])
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
