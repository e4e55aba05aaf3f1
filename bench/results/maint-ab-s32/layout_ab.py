"""Same-process A/B of session 32's integer layout of the pre-aggregated delta read
(``partials.Layout``): two pipelines of one shape on the same 1M-row table, maintained on the
same deltas in one snapshot, in alternating order. A reads a sum/avg over an integer as one
signed sum (the new layout); B is built with ``partials.INTEGERS`` emptied, so it reads the
four columns of before (sums over positive and negative weights, count, scale). Their sketches
are compared after every delta.

Why in one process: on this shared machine two benchmark runs minutes apart differed by more
than the change (``maint`` in this directory); here both sides see the same load.

    .venv/bin/python bench/results/maint-ab-s32/layout_ab.py SHAPE SIZES REPS
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from typing import Any

import psycopg

import pg_extensions
from bench import maintenance_bench as mb
from bench.maintenance_data import DeltaSource, R, S, T, build_shape, create_tables
from imp_proxy.embedded import given_or_throwaway as server
from sketches.ivm import collector, partials
from sketches.ivm.pipeline import Pipeline
from sketches.ivm.plan import compile


def timed(p: Pipeline, c: psycopg.Connection[Any]) -> float:
    t0 = time.perf_counter()
    p.maintain(c)
    return (time.perf_counter() - t0) * 1e3


def main(shape_name: str, sizes: list[int], reps: int) -> None:
    with server(None) as dsn:
        with psycopg.connect(dsn, autocommit=True) as c:
            pg_extensions.install(c)
            groups = create_tables(c, 1_000_000, 42, 1)
            shape = build_shape(c, shape_name, groups)
            prep = mb.prepare(c, shape, {})
            for t in (R, S, T):
                c.execute("SELECT imp.track_table(%s::regclass)", (t,))
        source = DeltaSource.for_table(1_000_000, groups, 42)
        a, b = compile(prep.analysis, prep.targets), compile(prep.analysis, prep.targets)
        with mb.snapshot_conn(dsn) as c, psycopg.connect(dsn) as writer, \
                psycopg.connect(dsn, autocommit=True) as coll:
            a.build_state(c)
            b.build_state(c)
            c.commit()
            for _ in range(2):
                mb._warm_up(c, a)
                names = vars(partials)   # B's delta read is built with no integer types
                saved, names["INTEGERS"] = names["INTEGERS"], frozenset()
                try:
                    mb._warm_up(c, b)
                finally:
                    names["INTEGERS"] = saved
            print(f"{shape_name}: A integer columns {sorted(a._layout.integer)}, "
                  f"B {sorted(b._layout.integer)}", flush=True)
            for size in sizes:
                res: dict[str, list[float]] = {"A": [], "B": []}
                for rep in range(reps):
                    gc.collect()
                    source.apply(writer, size)
                    c.execute("SELECT 1")
                    with collector.paused():
                        order = [("A", a), ("B", b)] if rep % 2 == 0 else [("B", b), ("A", a)]
                        for name, p in order:
                            res[name].append(timed(p, c))
                    assert a.sketch() == b.sketch()
                    c.commit()
                    assert a.version is not None
                    mb.gc_audit(coll, a.version)
                ma, mb_ = statistics.median(res["A"]), statistics.median(res["B"])
                print(f"{shape_name} {size} rows: A (one signed sum) {ma:.3f} ms, "
                      f"B (four columns) {mb_:.3f} ms, B/A {mb_ / ma:.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3]))
