"""Maintenance benchmark: IMP (incremental) vs full maintenance (issue 4, item 7).

    python -m bench.maintenance_bench [--scale small|medium|full] [--dsn DSN] [--shapes …]

Library level, no proxy: for every query shape of ``bench.maintenance_data`` a
:class:`sketches.ivm.pipeline.Pipeline` is compiled and its state built; then, per delta size
and repetition, a mixed delta is committed directly in PostgreSQL and, in one REPEATABLE READ
transaction (one snapshot, side by side, the order alternating between repetitions) on one
connection kept open for the whole shape (warm, as the proxy's service connection is), each
side timed after a full garbage collection:

* IMP: ``pipeline.maintain(conn)`` (fetching the delta from the audit table included);
* FM recapture: ``sketches.capture.capture`` of the same query;
* FM rebuild: a fresh pipeline's ``build_state`` (what full maintenance costs when the engine
  must keep going incrementally afterwards).

After every maintenance the maintained sketch must contain the freshly captured one (per slot);
a violation is a bug: it is logged loudly, listed in the report and the exit status is 1.

State memory per shape: length of the JSON ``Pipeline.snapshot()`` and the Python heap retained
by a freshly built pipeline (tracemalloc), per group of the aggregate (or entry of the top-k).

Outputs ``bench/results/maintenance_bench[-<scale>].md`` and ``….csv`` (raw measurements).
Without ``--dsn`` a throwaway PostgreSQL 15 cluster is started and destroyed afterwards.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import gc
import json
import logging
import math
import os
import signal
import statistics
import sys
import time
import tracemalloc
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

import pg_extensions
from bench.machine import machine_facts, revision
from bench.maintenance_data import (
    DeltaSource,
    Groups,
    R,
    S,
    Shape,
    T,
    all_shape_names,
    build_shape,
    create_tables,
)
from imp_proxy.embedded import given_or_throwaway as server
from sketches import lookup
from sketches.capture import CaptureTarget, capture
from sketches.ivm import collector
from sketches.ivm.pipeline import Pipeline
from sketches.ivm.plan import SketchTarget, compile
from sketches.pipelined import PREPARE_WHEN_ASKED
from sketches.ranges import RangePartition, build_partition
from sketches.safety import check
from sketches.sql import QueryAnalysis, analyse

log = logging.getLogger(__name__)

RESULTS = Path(__file__).parent / "results"
Conn = psycopg.Connection[Any]


@dataclass(frozen=True, slots=True)
class Scale:
    """``reps``: repetitions per delta size (``reps_large`` for the fractions);
    ``group_cap_div``: group counts capped at rows / this; ``rebuild``: time a fresh
    ``build_state`` in every repetition when the state has at most ``rebuild_max_groups``
    groups (else only where containment must be repaired)."""

    rows: int
    reps: int
    deltas: tuple[int, ...]
    fractions: tuple[float, ...]   # large deltas as fractions of the table
    shapes: tuple[str, ...]
    reps_large: int = 3
    group_cap_div: int = 2
    rebuild: bool = True
    rebuild_max_groups: int = 100_000
    collect_each: bool = False
    """A full garbage collection right before each timed side (the method of the runs before
    session 9) instead of once before the delta's write with the collector paused while
    timing."""
    gc_held: bool = False
    """After each repetition ``imp.gc_deltas`` runs with a bound that covers no audit row, as
    when another sketch's older state holds the collection back: the audit tables keep
    growing (and are analysed as they outgrow their statistics) instead of shrinking to the
    newest delta."""


def _big_last(names: list[str]) -> tuple[str, ...]:
    return tuple(sorted(names, key=lambda n: n == "groups-500K"))


FULL_SUBSET = ("groups-1K", "groups-5K", "topk-groups", "join-1n-5%")
SCALES: dict[str, Scale] = {
    "small": Scale(10_000, 1, (10, 100), (0.1,), tuple(all_shape_names()), reps_large=1,
                   group_cap_div=5, rebuild=False),
    "medium": Scale(200_000, 3, (10, 50, 100, 500, 1000), (0.01, 0.05, 0.1),
                    _big_last(all_shape_names())),
    "full": Scale(1_000_000, 5, (10, 50, 100, 500, 1000), (0.01, 0.05, 0.1),
                  _big_last(all_shape_names())),
}


class ContainmentViolation(AssertionError):
    """The maintained sketch misses a fragment of the freshly captured one: an engine bug."""


@dataclass(frozen=True, slots=True)
class Measurement:
    shape: str
    delta_rows: int
    audit_rows: int
    rep: int
    imp_ms: float
    recapture_ms: float
    rebuild_ms: float
    maintained: str          # fragments per slot, e.g. "31"
    captured: str
    extra: int               # fragments the maintained sketch has beyond the captured one
    contained: bool


@dataclass
class ShapeResult:
    shape: Shape
    fragments: str = ""
    groups: int = 0          # aggregate groups (or top-k entries) in the state
    build_ms: float = 0.0
    first_ms: tuple[float, ...] = ()   # the warm-up maintenances after the build (no delta)
    state_json_bytes: int = 0
    state_heap_bytes: int = 0
    measurements: list[Measurement] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Prepared:
    analysis: QueryAnalysis
    targets: tuple[SketchTarget, ...]
    capture_targets: tuple[CaptureTarget, ...]


# ---- setup ------------------------------------------------------------------------------


def snapshot_conn(dsn: str) -> Conn:
    """A connection like the proxy's service connections (same prepared-statement policy)."""
    c = psycopg.connect(dsn, prepare_threshold=PREPARE_WHEN_ASKED)
    c.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    return c


def prepare(conn: Conn, shape: Shape,
            partitions: dict[tuple[str, str, int], RangePartition]) -> Prepared:
    """Analysis and targets as the manager picks them: per table its first safe attribute,
    partitioned into ``shape.fragments`` fragments (partitions cached across shapes)."""
    analysis = analyse(shape.sql, lookup.resolver(conn))
    safety = check(analysis)
    if not safety.sketchable:
        raise RuntimeError(f"{shape.name}: not sketchable: {safety.reason}")
    targets, ctargets = [], []
    for index, attrs in sorted(safety.by_table().items()):
        table = analysis.tables[index]
        column = attrs[0].column.column
        key = (table.name, column, shape.fragments)
        if key not in partitions:
            partitions[key] = build_partition(conn, "public", table.name, column,
                                              shape.fragments)
        targets.append(SketchTarget(index, column, partitions[key]))
        ctargets.append(CaptureTarget(table, "public", column, partitions[key], False))
    return Prepared(analysis, tuple(targets), tuple(ctargets))


def _fmt(frags: Sequence[frozenset[int]]) -> str:
    return "/".join(str(len(f)) for f in frags)


def state_size(pipe: Pipeline) -> int:
    """Aggregate groups, or top-k entries, held by the state."""
    if pipe.aggregate is not None:
        return len(pipe.aggregate.groups)
    snap = pipe.snapshot()["ops"]
    topk = snap.get("topk") if isinstance(snap, dict) else None
    entries = topk.get("entries") if isinstance(topk, dict) else None
    return len(entries) if isinstance(entries, list) else 1


def heap_bytes(dsn: str, prep: Prepared) -> int:
    """Python heap retained by a freshly built pipeline (tracemalloc; not timed)."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        pipe = compile(prep.analysis, prep.targets)
        with snapshot_conn(dsn) as c:
            pipe.build_state(c)
            c.commit()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
        del pipe
        return held
    finally:
        tracemalloc.stop()


# ---- measurement ------------------------------------------------------------------------

def _check(shape: str, maintained: Sequence[frozenset[int]],
           captured: Sequence[frozenset[int]], what: str) -> tuple[bool, int]:
    ok, extra = True, 0
    for slot, (m, c) in enumerate(zip(maintained, captured, strict=True)):
        missing = c - m
        extra += len(m - c)
        if missing:
            ok = False
            log.error("CONTAINMENT VIOLATED (%s, %s, slot %d): maintained sketch lacks "
                      "fragments %s of the captured sketch", shape, what, slot,
                      sorted(missing)[:20])
    return ok, extra


def measure_once(c: Conn, shape: Shape, prep: Prepared, pipe: Pipeline, delta_rows: int,
                 audit_rows: int, rep: int, rebuild: bool = True,
                 collect_each: bool = False) -> tuple[Measurement, Pipeline | None]:
    """IMP, recapture and rebuild side by side in one snapshot, on ``c``: one warm REPEATABLE
    READ connection kept across measurements, like the proxy's service connection. Returns
    the measurement and, when the maintained sketch violated containment, the rebuilt
    pipeline to continue with.

    Garbage: the caller collects before writing the delta, and the collector is paused while
    the two sides run, so neither pays for the other's garbage. Why not a full collection
    right before each side (``collect_each``, the earlier method): it walks the whole Python
    heap (the pipeline states included) just before a millisecond-long maintenance, which
    then starts on cold CPU caches — about 0.2 ms more per maintenance (scratch), a cost of
    the benchmark, not of maintenance; the proxy never collects right before maintaining."""
    c.execute("SELECT 1")  # opens the transaction: both sides see one snapshot

    def imp() -> float:
        if collect_each:
            gc.collect()
        t0 = time.perf_counter()
        pipe.maintain(c)
        return (time.perf_counter() - t0) * 1e3

    def recapture() -> tuple[float, tuple[frozenset[int], ...]]:
        if collect_each:
            gc.collect()
        t0 = time.perf_counter()
        res = capture(c, shape.sql, prep.analysis, prep.capture_targets)
        return (time.perf_counter() - t0) * 1e3, tuple(p.fragments for p in res.parts)

    with _collector_paused(not collect_each):
        if rep % 2 == 0:
            imp_ms = imp()
            cap_ms, captured = recapture()
        else:
            cap_ms, captured = recapture()
            imp_ms = imp()
    maintained = pipe.sketch()
    ok, extra = _check(shape.name, maintained, captured, f"delta {delta_rows} rep {rep}")
    fresh = compile(prep.analysis, prep.targets)
    rebuild_ms = math.nan
    if rebuild or not ok:
        t0 = time.perf_counter()
        fresh.build_state(c)
        rebuild_ms = (time.perf_counter() - t0) * 1e3
    c.commit()
    ok_fresh = fresh.version is None or _check(shape.name, fresh.sketch(), captured,
                                               "rebuilt state")[0]
    m = Measurement(shape.name, delta_rows, audit_rows, rep, imp_ms, cap_ms, rebuild_ms,
                    _fmt(maintained), _fmt(captured), extra, ok and ok_fresh)
    return m, (None if ok else fresh)


def _collector_paused(pause: bool) -> AbstractContextManager[None]:
    """The automatic garbage collector off inside (when ``pause``), back as it was after."""
    return collector.paused() if pause else nullcontext()


NOTHING_COVERED = "1:1:"
"""A version no audit row is visible in: ``gc_audit`` with it deletes nothing."""


def gc_audit(collector: Conn, version: str) -> None:
    """Drops audit rows the pipeline's version covers (keeps the audit table small), on the
    collector's own long-lived autocommit connection, as the proxy's background thread does.
    (A connection per call, the earlier method, forks and ends a backend per repetition;
    side by side the two gave the same figures: ``bench/results/gc-conn-ab-s11``.)"""
    for t in (R, S, T):
        collector.execute("SELECT imp.gc_deltas(%s::regclass, %s::pg_snapshot)", (t, version))


def run_shape(dsn: str, shape: Shape, prep: Prepared, scale: Scale, source: DeltaSource,
              writer: Conn, collector: Conn) -> ShapeResult:
    out = ShapeResult(shape, fragments="/".join(
        str(t.partition.fragment_count) for t in prep.targets))
    pipe = compile(prep.analysis, prep.targets)
    with snapshot_conn(dsn) as c:
        t0 = time.perf_counter()
        pipe.build_state(c)
        out.build_ms = (time.perf_counter() - t0) * 1e3
        c.commit()
        out.first_ms = tuple(_warm_up(c, pipe) for _ in range(WARM_UP))
        _measure_deltas(c, out, shape, prep, scale, source, (writer, collector), pipe)
    out.state_heap_bytes = heap_bytes(dsn, prep)
    return out


WARM_UP = 2
"""Maintenances without a delta between the build and the timed ones: the first builds the
pipeline's delta queries (catalog reads, once per pipeline), the second prepares them. Their
times are reported on their own (``first maintenances``); the timed ones are steady state."""


def _warm_up(c: Conn, pipe: Pipeline) -> float:
    c.execute("SELECT 1")
    t0 = time.perf_counter()
    pipe.maintain(c)
    ms = (time.perf_counter() - t0) * 1e3
    c.commit()
    return ms


def _measure_deltas(c: Conn, out: ShapeResult, shape: Shape, prep: Prepared, scale: Scale,
                    source: DeltaSource, conns: tuple[Conn, Conn], pipe: Pipeline) -> None:
    writer, collector = conns
    out.state_json_bytes = len(json.dumps(pipe.snapshot(), separators=(",", ":")))
    out.groups = state_size(pipe)
    large = {max(1, round(f * scale.rows)) for f in scale.fractions} - set(scale.deltas)
    rebuild = scale.rebuild and out.groups <= scale.rebuild_max_groups
    for size in sorted({*scale.deltas, *large}):
        for rep in range(scale.reps_large if size in large else scale.reps):
            if not scale.collect_each:
                gc.collect()
            audit = source.apply(writer, size)
            m, replacement = measure_once(c, shape, prep, pipe, size, audit, rep, rebuild,
                                          scale.collect_each)
            out.measurements.append(m)
            if not m.contained:
                out.violations.append(f"delta {size} rep {rep}: maintained {m.maintained} "
                                      f"vs captured {m.captured}")
            if replacement is not None:
                pipe = replacement
            assert pipe.version is not None
            gc_audit(collector, NOTHING_COVERED if scale.gc_held else pipe.version)
            log.info("%-14s delta %7d rep %d: IMP %8.1f ms  recapture %8.1f ms  rebuild "
                     "%8.1f ms  ratio %7.1f%s", shape.name, size, rep, m.imp_ms,
                     m.recapture_ms, m.rebuild_ms, m.recapture_ms / max(m.imp_ms, 1e-6),
                     "" if m.contained else "  VIOLATION")


# ---- summary ----------------------------------------------------------------------------

def medians(res: ShapeResult) -> dict[int, tuple[float, float, float]]:
    """delta size -> (IMP, recapture, rebuild) medians in ms."""
    by: dict[int, list[Measurement]] = {}
    for m in res.measurements:
        by.setdefault(m.delta_rows, []).append(m)
    return {d: (statistics.median(m.imp_ms for m in ms),
                statistics.median(m.recapture_ms for m in ms),
                _median_nan([m.rebuild_ms for m in ms])) for d, ms in sorted(by.items())}


def _median_nan(values: list[float]) -> float:
    known = [v for v in values if not math.isnan(v)]
    return statistics.median(known) if known else math.nan


def break_even(med: dict[int, tuple[float, float, float]]) -> tuple[str, float | None]:
    """Delta size where IMP time reaches the recapture time (log-log interpolation between
    the measured sizes), or a bound when it is not reached within the measured range."""
    points = [(d, imp / cap) for d, (imp, cap, _r) in med.items()]
    if not points:
        return "n/a", None
    if points[-1][1] < 1:
        return f"> {points[-1][0]:,} rows (not reached)", None
    # the last measured size where IMP is still faster: FM wins from there on
    faster = [i for i, (_d, q) in enumerate(points) if q < 1]
    if not faster:
        return f"≤ {points[0][0]:,} rows", float(points[0][0])
    (d0, q0), (d1, q1) = points[faster[-1]], points[faster[-1] + 1]
    x = math.log(d0) + (math.log(d1) - math.log(d0)) * (-math.log(q0)) / \
        (math.log(q1) - math.log(q0))
    v = math.exp(x)
    return f"≈ {v:,.0f} rows", v


def _ratio(a: float, b: float) -> str:
    if math.isnan(a):
        return "—"
    r = a / b if b > 0 else float("inf")
    return f"{r:,.0f}×" if r >= 10 else f"{r:.1f}×"


def _against(r: float, target: float) -> str:
    """A ratio beside its target, with a decimal wherever rounding would hide which side of
    it the ratio is on (found: 9.53× at 1000 rows printed as "10×", next to "NO")."""
    shown = f"{r:,.0f}×"
    return f"{r:,.1f}×" if (r < target) != (round(r) < target) else shown


def report(results: list[ShapeResult], facts: dict[str, Any], scale_name: str, scale: Scale,
           setup_s: float, csv_path: Path) -> str:
    checks = sum(len(r.measurements) for r in results)
    violations = [(r.shape.name, v) for r in results for v in r.violations]
    errors = [(r.shape.name, r.error) for r in results if r.error]
    lines = [f"# Maintenance benchmark: IMP vs full maintenance ({scale_name} scale)", "",
             "```", facts["command"], "```", "",
             f"* {facts['timestamp_utc']}; git {revision(facts)} on {facts['git_branch']}",
             f"* machine: nproc {facts['nproc']}, {facts['cpu_model']}, "
             f"{facts['memory_bytes'] / 2**30:.1f} GiB RAM; load average at start "
             f"{' / '.join(f'{x:.2f}' for x in facts['loadavg_at_start'])}, at end "
             f"{' / '.join(f'{x:.2f}' for x in os.getloadavg())}",
             f"* {facts['postgresql']}; Python {facts['python']}",
             f"* table {R}: {scale.rows:,} rows; medians of {scale.reps} repetition(s) per "
             f"delta size ≤ 1000 and {scale.reps_large} per large delta; setup (data, "
             f"partitions) {setup_s:.0f} s; raw data: `{csv_path.name}`",
             "* rebuild timed " + ("in every repetition when the state has ≤ "
                                   f"{scale.rebuild_max_groups:,} groups (— elsewhere)"
                                   if scale.rebuild else "never (—)"),
             "* IMP = `Pipeline.maintain` (delta fetch included) in a REPEATABLE READ "
             "transaction; recapture = `sketches.capture.capture`; rebuild = a fresh "
             "pipeline's `build_state`; all three in the same snapshot, order alternating, on "
             "one warm connection per shape (with the proxy's prepared-statement policy), "
             + ("each timed right after `gc.collect()`; " if scale.collect_each else
                "garbage collected before each delta's write and the collector paused while "
                "IMP and recapture run; ")
             + f"{WARM_UP} maintenances without a delta "
             "precede the timed ones (they build and prepare the delta reads: "
             "*first maintenances* below); after each repetition `imp.gc_deltas` "
             + ("with a bound that covers nothing (`--gc-held`)" if scale.gc_held else
                "deletes the audit rows the state covers")
             + ", on one long-lived connection (as the proxy's background thread)",
             "* deltas: mixed ⅓ inserts, ⅓ updates (half move to other groups), ⅓ deletes "
             "on r, committed directly in PostgreSQL; audit rows = inserts + deletes + "
             "2 × updates; after each repetition "
             + ("`imp.gc_deltas` with a bound covering no audit row (*GC held back*, as by "
                "an older state of another sketch: the audit tables keep growing)"
                if scale.gc_held else "the audit rows the state covers are collected"), ""]
    if violations or errors:
        lines += ["## ❌ FAILURES", ""]
        lines += [f"* CONTAINMENT VIOLATED — {s}: {v}" for s, v in violations]
        lines += [f"* ERROR — {s}: {e}" for s, e in errors]
        lines.append("")
    else:
        lines += [f"**Containment: all {checks} maintained sketches ⊇ the freshly captured "
                  "sketch (and every rebuilt state too).**", ""]
    sizes = sorted({m.delta_rows for r in results for m in r.measurements})
    lines += ["## Ratio recapture time / IMP time (median)", "",
              "| shape | " + " | ".join(f"{d:,}" for d in sizes) + " | break-even |",
              "|---|" + "---:|" * (len(sizes) + 1)]
    for r in results:
        med = medians(r)
        cells = [_ratio(med[d][1], med[d][0]) if d in med else "" for d in sizes]
        lines.append(f"| {r.shape.name} | " + " | ".join(cells) + f" | {break_even(med)[0]} |")
    if scale.rebuild:
        lines += ["", "## Ratio rebuild-state time / IMP time (median)", "",
                  "| shape | " + " | ".join(f"{d:,}" for d in sizes) + " |",
                  "|---|" + "---:|" * len(sizes)]
        for r in results:
            med = medians(r)
            cells = [_ratio(med[d][2], med[d][0]) if d in med else "" for d in sizes]
            lines.append(f"| {r.shape.name} | " + " | ".join(cells) + " |")
    lines += ["", "## Median times (ms): IMP / recapture / rebuild", "",
              "| shape | " + " | ".join(f"{d:,}" for d in sizes) + " |",
              "|---|" + "---:|" * len(sizes)]
    for r in results:
        med = medians(r)
        cells = [f"{med[d][0]:.1f} / {med[d][1]:.0f} / "
                 + ("—" if math.isnan(med[d][2]) else f"{med[d][2]:.0f}") if d in med else ""
                 for d in sizes]
        lines.append(f"| {r.shape.name} | " + " | ".join(cells) + " |")
    if scale.rows >= 1_000_000:
        lines += ["", "## Targets (1M rows): ≥ 100× at ≤ 100 delta rows, ≥ 10× at 1000", "",
                  "| shape | worst ratio ≤ 100 rows | ratio at 1000 | met |", "|---|---:|---:|---|"]
        for r in results:
            med = medians(r)
            small = [med[d][1] / med[d][0] for d in med if d <= 100]
            at1k = med[1000][1] / med[1000][0] if 1000 in med else 0.0
            met = bool(small) and min(small) >= 100 and at1k >= 10
            lines.append(f"| {r.shape.name} | {_against(min(small) if small else 0, 100)} | "
                         f"{_against(at1k, 10)} | {'yes' if met else 'NO'} |")
    lines += ["", "## State and sketches", "",
              "| shape | query | groups/entries in state | fragments | sketch (maintained, "
              "last) | build ms | first maintenances ms | JSON bytes | JSON B/group | "
              "heap bytes | heap B/group |",
              "|---|---|---:|---|---|---:|---|---:|---:|---:|---:|"]
    for r in results:
        n = max(r.groups, 1)
        last = r.measurements[-1].maintained if r.measurements else ""
        lines.append(
            f"| {r.shape.name} | {r.shape.note} | {r.groups:,} | {r.fragments} | {last} | "
            f"{r.build_ms:.0f} | {' / '.join(f'{t:.1f}' for t in r.first_ms)} | "
            f"{r.state_json_bytes:,} | {r.state_json_bytes / n:,.0f} | "
            f"{r.state_heap_bytes:,} | {r.state_heap_bytes / n:,.0f} |")
    lines += ["", "## Queries", ""]
    lines += [f"* **{r.shape.name}**: `{r.shape.sql}`" for r in results]
    return "\n".join(lines) + "\n"


def write_csv(results: list[ShapeResult], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        names = [f.name for f in dataclasses.fields(Measurement)]
        w.writerow(names)
        for r in results:
            for m in r.measurements:
                d = asdict(m)
                w.writerow([d[n] for n in names])


# ---- main -------------------------------------------------------------------------------

def write_outputs(results: list[ShapeResult], facts: dict[str, Any], scale_name: str,
                  scale: Scale, setup_s: float, out_dir: Path, stem: str) -> str:
    """Writes ``stem``.csv and ``stem``.md (after every shape, so a cut run keeps its data)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / f"{stem}.csv"
    write_csv(results, csv_path)
    md = report(results, facts, scale_name, scale, setup_s, csv_path)
    (out_dir / f"{stem}.md").write_text(md)
    return md


@dataclass
class BenchRun:
    results: list[ShapeResult]
    markdown: str
    ok: bool


def run(dsn: str, scale_name: str, scale: Scale, out_dir: Path, stem: str,
        seed: int = 42) -> BenchRun:
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as c:
        pg_version = str(c.execute("SELECT version()").fetchone()[0])  # type: ignore[index]
        pg_extensions.install(c)
        groups: Groups = create_tables(c, scale.rows, seed, scale.group_cap_div)
        shapes, preps = [], []
        partitions: dict[tuple[str, str, int], RangePartition] = {}
        for name in scale.shapes:
            shape = build_shape(c, name, groups)
            shapes.append(shape)
            preps.append(prepare(c, shape, partitions))  # ANALYZE/DDL before tracking
    with psycopg.connect(dsn, autocommit=True) as c:
        for t in (R, S, T):
            c.execute("SELECT imp.track_table(%s::regclass)", (t,))
    setup_s = time.perf_counter() - started
    log.info("setup done in %.1f s", setup_s)
    facts = machine_facts(pg_version)
    source = DeltaSource.for_table(scale.rows, groups, seed)
    results: list[ShapeResult] = []
    with psycopg.connect(dsn) as writer, psycopg.connect(dsn, autocommit=True) as collector:
        for shape, prep in zip(shapes, preps, strict=True):
            try:
                # thresholds from the data as it is now (earlier shapes' deltas changed it);
                # the partitions are cached, so this runs no ANALYZE/DDL on tracked tables
                with psycopg.connect(dsn, autocommit=True) as c:
                    shape = build_shape(c, shape.name, groups)
                    prep = prepare(c, shape, partitions)
                res = run_shape(dsn, shape, prep, scale, source, writer, collector)
            except Exception as exc:  # noqa: BLE001 — recorded as this shape's failure
                log.exception("shape %s failed", shape.name)
                res = ShapeResult(shape, error=f"{type(exc).__name__}: {exc}")
            results.append(res)
            md = write_outputs(results, facts, scale_name, scale, setup_s, out_dir, stem)
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute(sql.SQL("VACUUM {}").format(sql.Identifier(R)))
    md = write_outputs(results, facts, scale_name, scale, setup_s, out_dir, stem)
    ok = all(not r.violations and r.error is None and r.measurements for r in results)
    return BenchRun(results, md, ok)


def _terminate(signum: int, _frame: object) -> None:
    """SIGTERM (and SIGINT, which a background job ignores) end the run through ``finally``
    blocks, so the throwaway cluster is destroyed; results written so far are kept."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    ap = argparse.ArgumentParser(prog="python -m bench.maintenance_bench",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", choices=sorted(SCALES), default="small")
    ap.add_argument("--dsn", help="superuser DSN (default: a throwaway local PostgreSQL 15)")
    ap.add_argument("--shapes", help="comma-separated shape names (default: the scale's); "
                    f"known: {', '.join(all_shape_names())}".replace("%", "%%"))
    ap.add_argument("--deltas", help="comma-separated delta sizes in rows (default: the scale's)")
    ap.add_argument("--fractions", help="comma-separated large deltas as fractions of the table"
                    " (default: the scale's; 'none' for no large delta)")
    ap.add_argument("--reps", type=int, help="repetitions per delta size ≤ 1000")
    ap.add_argument("--reps-large", type=int, help="repetitions per large (fractional) delta")
    ap.add_argument("--no-rebuild", action="store_true",
                    help="do not time a fresh build_state per repetition")
    ap.add_argument("--collect-each", action="store_true",
                    help="a full garbage collection right before each timed side (the "
                    "earlier method) instead of before the delta's write, collector paused")
    ap.add_argument("--gc-held", action="store_true",
                    help="collect no audit row between repetitions (as when an older state "
                    "holds the collection back) instead of every row the state covers")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--stem", help="output file name without extension "
                    "(default: maintenance_bench for full, maintenance_bench-<scale> else)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    scale = SCALES[args.scale]
    if args.shapes:
        names = tuple(s.strip() for s in args.shapes.split(",") if s.strip())
        unknown = set(names) - set(all_shape_names())
        if unknown:
            ap.error(f"unknown shapes: {', '.join(sorted(unknown))}")
        scale = dataclasses.replace(scale, shapes=names)
    if args.deltas:
        scale = dataclasses.replace(
            scale, deltas=tuple(int(d) for d in args.deltas.split(",") if d.strip()))
    if args.fractions:
        fractions = () if args.fractions == "none" else tuple(
            float(f) for f in args.fractions.split(",") if f.strip())
        scale = dataclasses.replace(scale, fractions=fractions)
    if args.reps:
        scale = dataclasses.replace(scale, reps=args.reps)
    if args.reps_large:
        scale = dataclasses.replace(scale, reps_large=args.reps_large)
    if args.no_rebuild:
        scale = dataclasses.replace(scale, rebuild=False)
    if args.collect_each:
        scale = dataclasses.replace(scale, collect_each=True)
    if args.gc_held:
        scale = dataclasses.replace(scale, gc_held=True)
    stem = args.stem or ("maintenance_bench" if args.scale == "full"
                         else f"maintenance_bench-{args.scale}")
    with server(args.dsn) as dsn:
        result = run(dsn, args.scale, scale, args.out, stem)
    print(result.markdown)
    if not result.ok:
        print("FAILED: containment violated or a configuration produced no result "
              "(see the report)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
