"""Command line: ``python -m bench run --scale small|medium|full [...]`` and
``python -m bench report <results-dir>``.

``run`` exits 1 when any answer through the proxy differed from PostgreSQL's, when any operation
failed, or when a run could not be completed; 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from bench.config import RATIOS, SCALES, Combo, RunConfig, SystemSpec
from bench.workload import QUERY_WEIGHTS

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _combo(text: str) -> Combo:
    ratio, _, d = text.partition("-d")
    if ratio not in RATIOS or not d.isdigit():
        raise SystemExit(f"bad cell {text!r}: use <ratio>-d<delta>, e.g. 1U5Q-d20")
    return Combo(ratio, int(d))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="generate data, run the workloads, check, report")
    r.add_argument("--scale", choices=sorted(SCALES), default="small")
    r.add_argument("--dsn", help="superuser DSN of an existing server (default: a throwaway "
                                 "local PostgreSQL 15); the harness creates/drops databases")
    r.add_argument("--run-name", help="results go to <results-dir>/<run-name>")
    r.add_argument("--results-dir", default=str(ROOT / "bench" / "results"))
    r.add_argument("--data-dir", default=str(ROOT / "bench" / "data"),
                   help="cache of generated TPC-H CSV")
    r.add_argument("--seed", type=int, default=42)
    r.add_argument("--rows", type=int, help="rows of r (overrides the scale)")
    r.add_argument("--groups", type=int, help="G, distinct values of r.a (50, 1000, 5000, …)")
    r.add_argument("--ops", type=int, help="operations per workload")
    r.add_argument("--ratios", type=_csv, help=f"comma list of {', '.join(RATIOS)}")
    r.add_argument("--deltas", type=_csv, help="comma list of rows per update, e.g. 1,20,200")
    r.add_argument("--cells", type=_csv,
                   help="explicit main-matrix cells instead of ratios × deltas, e.g. "
                        "1U1Q-d20,5U1Q-d2000")
    r.add_argument("--systems", type=_csv,
                   help="comma list: NS, FM, IMP-lazy, IMP-eager-<batch>")
    r.add_argument("--sweep-systems", type=_csv, help="systems of the batch-size sweep")
    r.add_argument("--sweep-combos", type=_csv, help="combos of the sweep, e.g. 1U1Q-d20")
    r.add_argument("--no-sweep", action="store_true", help="skip the batch-size sweep")
    r.add_argument("--templates", type=_csv,
                   help="query templates of the mix: having, join, topk, tpch-topk")
    r.add_argument("--tpch-sf", type=float, help="TPC-H scale factor (0: no TPC-H)")
    r.add_argument("--proxy-code", default="HEAD",
                   help="git revision whose committed code the proxy runs (extracted with git "
                        "archive; default HEAD), or 'worktree' for the working tree as it is")
    r.add_argument("--proxy-bin", help="an imp-proxy executable to run instead (working tree)")
    r.add_argument("--proxy-arg", action="append", default=[],
                   help="extra argument for `imp-proxy serve` (repeatable)")
    r.add_argument("--no-check", action="store_true", help="do not compare answers")
    r.add_argument("--keep-databases", action="store_true")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("-v", "--verbose", action="store_true")
    rep = sub.add_parser("report", help="re-render summary.md and plots from results.json")
    rep.add_argument("dir")
    mer = sub.add_parser("merge", help="combine runs of several result dirs measured on the "
                                       "same data and workloads (same scale, seed) into one")
    mer.add_argument("out")
    mer.add_argument("dirs", nargs="+")
    return p


def config_from_args(a: argparse.Namespace) -> RunConfig:
    sc = SCALES[a.scale]
    if a.rows is not None:
        sc = replace(sc, rows=a.rows)
    if a.groups is not None:
        sc = replace(sc, groups=a.groups)
    if a.ops is not None:
        sc = replace(sc, ops=a.ops)
    if a.ratios:
        bad = [x for x in a.ratios if x not in RATIOS]
        if bad:
            raise SystemExit(f"unknown ratio(s) {bad}; use {list(RATIOS)}")
        sc = replace(sc, ratios=tuple(a.ratios), cells=())
    if a.deltas:
        sc = replace(sc, deltas=tuple(int(d) for d in a.deltas), cells=())
    if a.cells:
        sc = replace(sc, cells=tuple(_combo(c) for c in a.cells))
        sc = replace(sc, ratios=tuple(dict.fromkeys(c.ratio for c in sc.cells)),
                     deltas=tuple(dict.fromkeys(c.delta for c in sc.cells)))
    if a.systems:
        sc = replace(sc, systems=tuple(SystemSpec.parse(s) for s in a.systems))
    if a.sweep_systems:
        sc = replace(sc, sweep_systems=tuple(SystemSpec.parse(s) for s in a.sweep_systems))
    if a.sweep_combos:
        sc = replace(sc, sweep_combos=tuple(_combo(c) for c in a.sweep_combos))
    if a.no_sweep:
        sc = replace(sc, sweep_combos=(), sweep_systems=())
    if a.templates:
        bad = [t for t in a.templates if t not in QUERY_WEIGHTS]
        if bad:
            raise SystemExit(f"unknown template(s) {bad}; use {list(QUERY_WEIGHTS)}")
        sc = replace(sc, templates=tuple(a.templates))
    if a.tpch_sf is not None:
        sc = replace(sc, tpch_sf=a.tpch_sf)
    name = a.run_name or f"{a.scale}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"
    return RunConfig(scale=sc, seed=a.seed, dsn=a.dsn, run_name=name,
                     results_dir=a.results_dir, proxy_bin=a.proxy_bin,
                     proxy_code=a.proxy_code,
                     proxy_args=tuple(a.proxy_arg), check=not a.no_check,
                     keep_databases=a.keep_databases,
                     progress=not a.no_progress and sys.stderr.isatty())


def cmd_run(a: argparse.Namespace) -> int:
    from bench.machine import machine_facts
    from bench.report import write_all
    from bench.runner import Bench, BenchResult

    cfg = config_from_args(a)
    out = Path(cfg.results_dir) / cfg.run_name
    out.mkdir(parents=True, exist_ok=True)
    fh = logging.FileHandler(out / "bench.log")
    fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(fh)
    log.info("run %s -> %s", cfg.run_name, out)
    facts = machine_facts()

    def checkpoint(partial: BenchResult) -> None:
        facts["postgresql"] = partial.pg_version
        write_all(partial, out, facts, partial=True)

    result = Bench(cfg, out, Path(a.data_dir), checkpoint).run()
    facts["postgresql"] = result.pg_version
    doc = write_all(result, out, facts)
    errors = sum(r["errors"] for r in doc["runs"])
    failed = [r for r in doc["runs"] if r["error"]]
    print(f"results: {out}")
    print((out / "summary.md").read_text())
    if result.mismatches or errors or failed:
        print(f"FAILED: {result.mismatches} mismatches, {errors} failed operations, "
              f"{len(failed)} failed runs", file=sys.stderr)
        return 1
    return 0


def cmd_report(a: argparse.Namespace) -> int:
    from bench.report import render, write_runs_csv

    out = Path(a.dir)
    doc = json.loads((out / "results.json").read_text())
    write_runs_csv(doc, out / "runs.csv")
    render(doc, out)
    print((out / "summary.md").read_text())
    return 0


def cmd_merge(a: argparse.Namespace) -> int:
    from bench.report import merge

    out = merge([Path(d) for d in a.dirs], Path(a.out))
    print((out / "summary.md").read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: databases dropped, proxy and throwaway PostgreSQL stopped
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    logging.basicConfig(level=logging.DEBUG if getattr(a, "verbose", False) else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    if a.cmd == "run":
        return cmd_run(a)
    if a.cmd == "merge":
        return cmd_merge(a)
    return cmd_report(a)
