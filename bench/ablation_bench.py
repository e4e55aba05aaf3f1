"""Ablation benchmark: each maintenance optimisation of issue 4 switched on vs off.

    python -m bench.ablation_bench [--scale small|full] [--dsn DSN] [--reps N] [--out DIR]

Library level, no proxy, on the data, shapes and mixed deltas of ``bench.maintenance_data``
(setup reused from ``bench.maintenance_bench``). Per ablation one shape gets two pipelines
that differ only in one :class:`sketches.ivm.plan.Options` field:

* (a) ``join_filter`` on/off — join-1n-1%, join-1n-5%, join-mn-5%, both sides row by row
  (``preaggregate`` off); plus the cost of building the key filters (timed alone,
  ``Pipeline._build_filters``) against one capture;
* ``preaggregate`` on/off — groups-5K (one table), join-1n-5% and join-mn-5% (the join's
  delta evaluated and summed in PostgreSQL vs fetched row by row with partner lookups);
* (b) ``pushdown`` on/off — where-10% (``WHERE r.c < q10`` under GROUP BY a HAVING);
* ``minmax_counts`` on/off — aggs-3 and aggs-10 (``max(d) >= c`` in HAVING as a count of
  the rows with ``d >= c`` vs a buffer of the 64 largest values per group);
* (c) ``minmax_buffer`` 64 vs None (all values) — aggs-3 (``max(d)``, ``minmax_counts`` off on
  both sides); ``topk_buffer``
  default (max(2k, k + 64)) vs 16 — topk-rows, and vs every group — topk-groups; buffer
  refills counted;
* ``fuse_having`` on/off — groups-1K and aggs-10 (aggregate, HAVING and merge as one step
  vs one operator after another).

Both states are built in one snapshot, then per delta size and repetition one mixed delta is
committed and both pipelines maintain it in one REPEATABLE READ snapshot on one warm
connection, the order alternating, each side after ``gc.collect()``. A capture in that same
snapshot checks containment (maintained ⊇ captured, per slot) for both sides; a violation is
logged, listed in the report, and the exit status is 1.

Why side by side in one snapshot: the machine is shared, so load drifts between runs; two
measurements a few milliseconds apart on the same delta see the same load and the same data.

Outputs ``<out>/ablation_bench[-small].md`` and ``….csv`` (raw measurements).
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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

import pg_extensions
from bench.machine import machine_facts, revision
from bench.maintenance_bench import (
    RESULTS,
    Prepared,
    _check,
    _fmt,
    gc_audit,
    prepare,
    snapshot_conn,
    state_size,
)
from bench.maintenance_data import DeltaSource, Groups, R, S, Shape, T, build_shape, create_tables
from imp_proxy.embedded import given_or_throwaway as server
from sketches.capture import capture
from sketches.ivm.pipeline import Pipeline
from sketches.ivm.plan import Options, compile
from sketches.ranges import RangePartition

log = logging.getLogger(__name__)

Conn = psycopg.Connection[Any]
SIDES = ("on", "off")


@dataclass(frozen=True, slots=True)
class Ablation:
    """One optimisation on one shape: ``on``/``off`` are the two pipelines' options."""

    option: str
    shape: str
    on: Options
    off: Options
    on_label: str
    off_label: str


ALL_GROUPS = 10**9
"""A top-k buffer no table here fills: the top-k over groups keeps every group."""

ABLATIONS: tuple[Ablation, ...] = (
    # a join's pre-aggregated delta needs no partner lookups, so the filter is measured on the
    # per-row path on both sides (the filter keeps pre-aggregation off by itself)
    *(Ablation("join_filter", s, Options(join_filter=True),
               Options(join_filter=False, preaggregate=False),
               "filter", "no filter") for s in ("join-1n-1%", "join-1n-5%", "join-mn-5%")),
    *(Ablation("preaggregate", s, Options(preaggregate=True), Options(preaggregate=False),
               "pre-aggregated", "per row") for s in ("groups-5K", "join-1n-5%", "join-mn-5%")),
    Ablation("pushdown", "where-10%", Options(pushdown=True), Options(pushdown=False),
             "pushed", "unpushed"),
    Ablation("minmax_buffer", "aggs-3", Options(minmax_buffer=64, minmax_counts=False),
             Options(minmax_buffer=None, minmax_counts=False), "64", "all values"),
    *(Ablation("minmax_counts", s, Options(minmax_counts=True), Options(minmax_counts=False),
               "counts", "buffers (64)") for s in ("aggs-3", "aggs-10")),
    Ablation("topk_buffer", "topk-rows", Options(topk_buffer=None), Options(topk_buffer=16),
             "default (74)", "16"),
    Ablation("topk_buffer", "topk-groups", Options(topk_buffer=None),
             Options(topk_buffer=ALL_GROUPS), "default (74)", "all groups"),
    *(Ablation("fuse_having", s, Options(fuse_having=True), Options(fuse_having=False),
               "fused", "operators") for s in ("groups-1K", "aggs-10")),
)


@dataclass(frozen=True, slots=True)
class Scale:
    rows: int
    reps: int
    deltas: tuple[int, ...]
    group_cap_div: int = 2


SCALES: dict[str, Scale] = {
    "small": Scale(10_000, 1, (10, 100, 1000), group_cap_div=5),
    "full": Scale(1_000_000, 3, (10, 100, 1000)),
}


@dataclass(frozen=True, slots=True)
class Measurement:
    option: str
    shape: str
    delta_rows: int
    audit_rows: int
    rep: int
    first: str               # side timed first ("on" | "off")
    on_ms: float
    off_ms: float
    capture_ms: float
    on_refills: int          # buffer refills during this maintenance
    off_refills: int
    on_skipped: int          # join lookups skipped by the key filter
    off_skipped: int
    on_keys_filtered: int    # join keys the key filter dropped before a lookup
    maintained_on: str
    maintained_off: str
    captured: str
    contained: bool


@dataclass
class Side:
    """Build-time facts of one pipeline."""

    build_ms: float = 0.0
    state_size: int = 0
    json_bytes: int = 0
    refills: int = 0         # during both builds


@dataclass
class AblationResult:
    ablation: Ablation
    shape: Shape
    sides: dict[str, Side] = field(default_factory=dict)
    filter_ms: float = math.nan     # (a): key filters built alone
    capture_ms: float = math.nan    # one capture in the build snapshot
    measurements: list[Measurement] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    error: str | None = None


# ---- pipelines ----------------------------------------------------------------------------

class Counted:
    """A pipeline with its buffer refills counted.

    Why instance attributes: ``Pipeline._reset`` hands ``self._refill_*`` to the operators, so
    wrappers set on the instance before ``build_state`` are what the operators call; the
    engine's code stays untouched."""

    def __init__(self, prep: Prepared, options: Options) -> None:
        self.pipe: Pipeline = compile(prep.analysis, prep.targets, None, options)
        self.refills = 0
        for name in ("_refill_values", "_refill_top", "_refill_top_groups"):
            setattr(self.pipe, name, self._counting(getattr(self.pipe, name)))

    def _counting(self, refill: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any) -> Any:
            self.refills += 1
            return refill(*args)
        return wrapped


def _timed(fn: Callable[[], object]) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def _capture(c: Conn, shape: Shape, prep: Prepared) -> tuple[float, tuple[frozenset[int], ...]]:
    gc.collect()
    t0 = time.perf_counter()
    res = capture(c, shape.sql, prep.analysis, prep.capture_targets)
    return (time.perf_counter() - t0) * 1e3, tuple(p.fragments for p in res.parts)


def _filter_ms(c: Conn, pipe: Pipeline) -> float:
    """The key filters built again, alone (same snapshot, same content): their build cost."""
    pipe._conn = c
    try:
        return _timed(pipe._build_filters)
    finally:
        pipe._conn = None


def build_pair(c: Conn, res: AblationResult, prep: Prepared) -> dict[str, Counted]:
    """Both pipelines built twice in one snapshot (on, off, off, on: neither side always
    meets cold caches), the faster build kept; plus one capture to compare with."""
    a = res.ablation
    pipes = {"on": Counted(prep, a.on), "off": Counted(prep, a.off)}
    c.execute("SELECT 1")
    builds: dict[str, list[float]] = {side: [] for side in SIDES}
    for side in (*SIDES, *SIDES[::-1]):
        cp = pipes[side]
        builds[side].append(_timed(lambda cp=cp: cp.pipe.build_state(c)))  # type: ignore[misc]
    for side, cp in pipes.items():
        res.sides[side] = Side(min(builds[side]), state_size(cp.pipe),
                               len(json.dumps(cp.pipe.snapshot(), separators=(",", ":"))),
                               cp.refills)
    res.capture_ms, captured = _capture(c, res.shape, prep)
    if a.option == "join_filter":
        res.filter_ms = _filter_ms(c, pipes["on"].pipe)
    c.commit()
    for side in SIDES:
        ok, _extra = _check(res.shape.name, pipes[side].pipe.sketch(), captured,
                            f"{side}: built state")
        if not ok:
            res.violations.append(f"{side}: built state misses captured fragments")
    return pipes


def _counters(cp: Counted) -> tuple[int, int, int]:
    """(refills, lookups skipped, keys filtered) so far."""
    stats = cp.pipe.stats
    return cp.refills, stats["lookups_skipped"], stats["keys_filtered"]


def measure_once(c: Conn, res: AblationResult, prep: Prepared, pipes: dict[str, Counted],
                 delta: tuple[int, int], rep: int, turn: int) -> Measurement:
    """Both sides maintain one delta in one snapshot, order alternating by ``turn``."""
    order = SIDES if turn % 2 == 0 else SIDES[::-1]
    before = {s: _counters(pipes[s]) for s in SIDES}
    c.execute("SELECT 1")  # opens the transaction: every side sees one snapshot
    ms = {s: _timed(lambda s=s: pipes[s].pipe.maintain(c)) for s in order}  # type: ignore[misc]
    cap_ms, captured = _capture(c, res.shape, prep)
    c.commit()
    ok = True
    for s in SIDES:
        ok = _check(res.shape.name, pipes[s].pipe.sketch(), captured,
                    f"{s}, delta {delta[0]} rep {rep}")[0] and ok
    after = {s: _counters(pipes[s]) for s in SIDES}
    d = {s: tuple(x - y for x, y in zip(after[s], before[s], strict=True)) for s in SIDES}
    return Measurement(
        res.ablation.option, res.shape.name, delta[0], delta[1], rep, order[0],
        ms["on"], ms["off"], cap_ms, d["on"][0], d["off"][0], d["on"][1], d["off"][1],
        d["on"][2],
        _fmt(pipes["on"].pipe.sketch()), _fmt(pipes["off"].pipe.sketch()), _fmt(captured), ok)


def run_ablation(dsn: str, res: AblationResult, prep: Prepared, scale: Scale,
                 source: DeltaSource, writer: Conn, collector: Conn) -> None:
    with snapshot_conn(dsn) as c:
        pipes = build_pair(c, res, prep)
        turn = 0
        for size in scale.deltas:
            for rep in range(scale.reps):
                audit = source.apply(writer, size)
                m = measure_once(c, res, prep, pipes, (size, audit), rep, turn)
                turn += 1
                res.measurements.append(m)
                if not m.contained:
                    res.violations.append(f"delta {size} rep {rep}: on {m.maintained_on}, "
                                          f"off {m.maintained_off}, captured {m.captured}")
                version = pipes["on"].pipe.version
                assert version is not None
                gc_audit(collector, version)
                log.info("%-13s %-11s delta %5d rep %d: on %7.1f ms  off %7.1f ms  "
                         "off/on %5.2f%s", res.ablation.option, res.shape.name, size, rep,
                         m.on_ms, m.off_ms, m.off_ms / max(m.on_ms, 1e-6),
                         "" if m.contained else "  VIOLATION")


# ---- report -----------------------------------------------------------------------------

def _med(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _ratio(on: float, off: float) -> str:
    return "—" if math.isnan(on) or math.isnan(off) or on <= 0 else f"{off / on:.2f}"


def _header(facts: dict[str, Any], scale_name: str, scale: Scale, setup_s: float,
            csv_name: str) -> list[str]:
    load = " / ".join(f"{x:.2f}" for x in facts["loadavg_at_start"])
    return [f"# Ablation benchmark: maintenance optimisations on vs off ({scale_name} scale)",
            "", "```", facts["command"], "```", "",
            f"* {facts['timestamp_utc']}; git {revision(facts)} on {facts['git_branch']}",
            f"* machine: nproc {facts['nproc']}, {facts['cpu_model']}, "
            f"{facts['memory_bytes'] / 2**30:.1f} GiB RAM (shared); load average at start "
            f"{load}, at end {' / '.join(f'{x:.2f}' for x in os.getloadavg())}",
            f"* {facts['postgresql']}; Python {facts['python']}",
            f"* table {R}: {scale.rows:,} rows; {scale.reps} repetition(s) per delta size "
            f"(medians); setup {setup_s:.0f} s; raw data: `{csv_name}`",
            "* per shape both pipelines maintain the same committed delta in one REPEATABLE "
            "READ snapshot, order alternating, each after `gc.collect()`; ratio = off / on "
            "(> 1: the optimisation saves time)", ""]


def _time_table(results: list[AblationResult], sizes: list[int]) -> list[str]:
    lines = ["## IMP maintain time, median ms on / off (ratio off ÷ on)", "",
             "| option | shape | on | off | " + " | ".join(f"{d:,} rows" for d in sizes) + " |",
             "|---|---|---|---|" + "---:|" * len(sizes)]
    for r in results:
        cells = []
        for d in sizes:
            ms = [m for m in r.measurements if m.delta_rows == d]
            on, off = _med([m.on_ms for m in ms]), _med([m.off_ms for m in ms])
            cells.append(f"{on:.1f} / {off:.1f} ({_ratio(on, off)})" if ms else "")
        a = r.ablation
        lines.append(f"| {a.option} | {r.shape.name} | {a.on_label} | {a.off_label} | "
                     + " | ".join(cells) + " |")
    return lines


def _build_table(results: list[AblationResult]) -> list[str]:
    lines = ["", "## State build and size", "",
             "| option | shape | build_state ms on / off (ratio; best of 2) | "
             "state groups/entries on / off | JSON bytes on / off | "
             "refills on / off (2 builds + maintain) | lookups skipped / keys filtered (on) |",
             "|---|---|---|---|---|---|---:|"]
    for r in results:
        if len(r.sides) < 2:
            continue
        on, off = r.sides["on"], r.sides["off"]
        refills = [on.refills + sum(m.on_refills for m in r.measurements),
                   off.refills + sum(m.off_refills for m in r.measurements)]
        skipped = sum(m.on_skipped for m in r.measurements)
        keys = sum(m.on_keys_filtered for m in r.measurements)
        lines.append(
            f"| {r.ablation.option} | {r.shape.name} | {on.build_ms:.0f} / {off.build_ms:.0f} "
            f"({_ratio(on.build_ms, off.build_ms)}) | {on.state_size:,} / {off.state_size:,} | "
            f"{on.json_bytes:,} / {off.json_bytes:,} | {refills[0]} / {refills[1]} | "
            f"{skipped:,} / {keys:,} |")
    return lines


def _filter_table(results: list[AblationResult]) -> list[str]:
    rows = [r for r in results if not math.isnan(r.filter_ms)]
    if not rows:
        return []
    lines = ["", "## (a) Key-filter build cost vs one capture", "",
             "| shape | filters built alone ms | one capture ms | filter ÷ capture | "
             "build_state on − off ms |", "|---|---:|---:|---:|---:|"]
    for r in rows:
        diff = r.sides["on"].build_ms - r.sides["off"].build_ms
        lines.append(f"| {r.shape.name} | {r.filter_ms:.0f} | {r.capture_ms:.0f} | "
                     f"{r.filter_ms / r.capture_ms:.2f} | {diff:.0f} |")
    return lines


def report(results: list[AblationResult], facts: dict[str, Any], scale_name: str,
           scale: Scale, setup_s: float, csv_name: str) -> str:
    lines = _header(facts, scale_name, scale, setup_s, csv_name)
    problems = [(r.shape.name, v) for r in results for v in r.violations]
    problems += [(r.shape.name, f"ERROR {r.error}") for r in results if r.error]
    if problems:
        lines += ["## ❌ FAILURES", "", *(f"* {s}: {v}" for s, v in problems), ""]
    else:
        checks = sum(2 * len(r.measurements) for r in results)
        lines += [f"**Containment: all {checks} maintained sketches (both sides) ⊇ the captured "
                  "sketch of the same snapshot.**", ""]
    sizes = sorted({m.delta_rows for r in results for m in r.measurements})
    lines += _time_table(results, sizes) + _build_table(results) + _filter_table(results)
    lines += ["", "## Queries", "", *(f"* **{r.shape.name}** ({r.shape.note}): `{r.shape.sql}`"
                                      for r in results)]
    return "\n".join(lines) + "\n"


def write_outputs(results: list[AblationResult], facts: dict[str, Any], scale_name: str,
                  scale: Scale, setup_s: float, out_dir: Path, stem: str) -> str:
    """Writes ``stem``.csv and ``stem``.md (after every ablation: a cut run keeps its data)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / f"{stem}.csv").open("w", newline="") as f:
        w = csv.writer(f)
        names = [x.name for x in dataclasses.fields(Measurement)]
        w.writerow(names)
        for r in results:
            w.writerows([asdict(m)[n] for n in names] for m in r.measurements)
    md = report(results, facts, scale_name, scale, setup_s, f"{stem}.csv")
    (out_dir / f"{stem}.md").write_text(md)
    return md


# ---- main -------------------------------------------------------------------------------

@dataclass
class BenchRun:
    results: list[AblationResult]
    markdown: str
    ok: bool


def _setup(dsn: str, scale: Scale, seed: int) -> tuple[str, Groups]:
    """Data (tables created and ANALYZEd before tracking starts) and tracking."""
    with psycopg.connect(dsn, autocommit=True) as c:
        pg_version = str(c.execute("SELECT version()").fetchone()[0])  # type: ignore[index]
        pg_extensions.install(c)
        groups = create_tables(c, scale.rows, seed, scale.group_cap_div)
    return pg_version, groups


def _prepared(dsn: str, name: str, groups: Groups,
              partitions: dict[tuple[str, str, int], RangePartition]) -> tuple[Shape, Prepared]:
    with psycopg.connect(dsn, autocommit=True) as c:
        shape = build_shape(c, name, groups)
        return shape, prepare(c, shape, partitions)


def run(dsn: str, scale_name: str, scale: Scale, out_dir: Path, stem: str,
        ablations: tuple[Ablation, ...] = ABLATIONS, seed: int = 42) -> BenchRun:
    started = time.perf_counter()
    pg_version, groups = _setup(dsn, scale, seed)
    partitions: dict[tuple[str, str, int], RangePartition] = {}
    for a in ablations:   # partitions (ANALYZE) before tracking, like the maintenance bench
        _prepared(dsn, a.shape, groups, partitions)
    with psycopg.connect(dsn, autocommit=True) as c:
        for t in (R, S, T):
            c.execute("SELECT imp.track_table(%s::regclass)", (t,))
    setup_s = time.perf_counter() - started
    facts = machine_facts(pg_version)
    source = DeltaSource.for_table(scale.rows, groups, seed)
    results: list[AblationResult] = []
    with psycopg.connect(dsn) as writer, psycopg.connect(dsn, autocommit=True) as collector:
        for a in ablations:
            shape, prep = _prepared(dsn, a.shape, groups, partitions)  # thresholds from now
            res = AblationResult(a, shape)
            try:
                run_ablation(dsn, res, prep, scale, source, writer, collector)
            except Exception as exc:  # noqa: BLE001 — recorded as this ablation's failure
                log.exception("ablation %s on %s failed", a.option, a.shape)
                res.error = f"{type(exc).__name__}: {exc}"
            results.append(res)
            write_outputs(results, facts, scale_name, scale, setup_s, out_dir, stem)
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute(sql.SQL("VACUUM {}").format(sql.Identifier(R)))
    md = write_outputs(results, facts, scale_name, scale, setup_s, out_dir, stem)
    ok = all(not r.violations and r.error is None and r.measurements for r in results)
    return BenchRun(results, md, ok)


def _terminate(signum: int, _frame: object) -> None:
    """SIGTERM ends the run through ``finally`` blocks (the throwaway cluster is destroyed)."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    ap = argparse.ArgumentParser(prog="python -m bench.ablation_bench",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", choices=sorted(SCALES), default="small")
    ap.add_argument("--dsn", help="superuser DSN (default: a throwaway local PostgreSQL 15)")
    ap.add_argument("--reps", type=int, help="repetitions per delta size")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--stem", help="output name without extension "
                    "(default: ablation_bench for full, ablation_bench-<scale> else)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    scale = SCALES[args.scale]
    if args.reps:
        scale = dataclasses.replace(scale, reps=args.reps)
    stem = args.stem or ("ablation_bench" if args.scale == "full"
                         else f"ablation_bench-{args.scale}")
    with server(args.dsn) as dsn:
        result = run(dsn, args.scale, scale, args.out, stem)
    print(result.markdown)
    if not result.ok:
        print("FAILED: containment violated or an ablation produced no result",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
