"""Runs the experiment matrix: data once into a template database, then for every combo
(ratio × delta) and every system a fresh clone of it, the combo's workload, and the checks.

Every query answered through the proxy is re-run directly on PostgreSQL right afterwards, with no
write in between (the harness is the only writer), and the two answers are compared.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench import datagen
from bench.compare import compare
from bench.config import Combo, RunConfig, SystemSpec
from bench.systems import Endpoint, ProxyLauncher, execute, open_endpoint
from bench.workload import DataStats, Op, WorkloadGenerator
from imp_proxy.embedded import given_or_throwaway as postgres

log = logging.getLogger(__name__)

MAX_MISMATCH_DETAILS = 50
#: columns of IMP SHOW SKETCHES that are not additive counters
NOT_COUNTERS = frozenset({"id", "sketch_id", "fragments", "selected_fragments", "version",
                          "coverage", "template", "tables", "attributes", "strategy",
                          "last_used"})


@dataclass(slots=True)
class OpResult:
    system: str
    combo: str
    ratio: str
    delta: int
    index: int
    kind: str
    template: str
    seconds: float
    rows: int
    match: bool | None  # None: not checked (NS is the oracle itself)
    error: str = ""


@dataclass(slots=True)
class RunResult:
    """One (combo, system) run: totals over its operations and the proxy's sketch counters."""

    system: str
    combo: str
    ratio: str
    delta: int
    sweep: bool
    n_queries: int = 0
    n_updates: int = 0
    query_s: float = 0.0
    update_s: float = 0.0
    wall_s: float = 0.0
    checked: int = 0
    #: queries right after an update: they pay lazy maintenance / FM recapture
    after_update_n: int = 0
    after_update_s: float = 0.0
    mismatches: int = 0
    errors: int = 0
    counters: dict[str, float] = field(default_factory=dict)
    sketches: list[dict[str, Any]] = field(default_factory=list)
    proxy_stats: dict[str, Any] = field(default_factory=dict)
    configured: str = ""
    loadavg_1m: float = 0.0  # machine load when the run started (other work on the box)
    error: str = ""

    @property
    def total_s(self) -> float:
        return self.query_s + self.update_s

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["total_s"] = self.total_s
        return d


@dataclass
class BenchResult:
    config: RunConfig
    stats: DataStats
    runs: list[RunResult]
    ops: list[OpResult]
    mismatch_details: list[dict[str, Any]]
    pg_version: str
    setup_s: float
    proxy_code: str = ""

    @property
    def mismatches(self) -> int:
        return sum(r.mismatches for r in self.runs)

    @property
    def failed_runs(self) -> list[RunResult]:
        return [r for r in self.runs if r.error]


# -------------------------------------------------------------------------------- sketch stats

def sketch_counters(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Sums of the numeric columns of ``IMP SHOW SKETCHES`` over all sketches (uses, …)."""
    out: dict[str, float] = {"sketches": float(len(rows))}
    for row in rows:
        for k, v in row.items():
            if isinstance(v, bool) or k in NOT_COUNTERS:
                continue
            if isinstance(v, int | float):
                out[k] = out.get(k, 0.0) + float(v)
            else:
                try:
                    out[k] = out.get(k, 0.0) + float(str(v))
                except (TypeError, ValueError):
                    continue
    return out


# ----------------------------------------------------------------------------------- servers


def db_dsn(admin_dsn: str, dbname: str) -> str:
    return psycopg.conninfo.make_conninfo(admin_dsn, dbname=dbname)


def create_database(admin_dsn: str, name: str, template: str | None = None) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        if template is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        else:
            conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                sql.Identifier(name), sql.Identifier(template)))


def drop_database(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))


# ------------------------------------------------------------------------------------ running

class Bench:
    """One invocation of the harness."""

    def __init__(self, config: RunConfig, out_dir: Path, data_dir: Path,
                 checkpoint: Callable[[BenchResult], None] | None = None) -> None:
        self.config = config
        self.checkpoint = checkpoint
        self.out_dir = out_dir
        self.data_dir = data_dir
        self.tag = uuid.uuid4().hex[:8]
        self.ops: list[OpResult] = []
        self.mismatch_details: list[dict[str, Any]] = []
        self._prev_kind = ""
        self.launcher: ProxyLauncher | None = None
        self._pg_version = ""
        self._setup_s = 0.0

    def plan(self) -> list[tuple[Combo, SystemSpec, bool]]:
        sc = self.config.scale
        cells = [(c, s, False) for c in sc.combos() for s in sc.systems]
        cells += [(c, s, True) for c in sc.sweep_combos for s in sc.sweep_systems
                  if (c, s) not in {(x, y) for x, y, _ in cells}]
        return cells

    def run(self) -> BenchResult:
        sc = self.config.scale
        if any(s.via_proxy for _, s, _ in self.plan()):
            self.launcher = ProxyLauncher.from_config(
                self.config.proxy_bin, self.config.proxy_code, Path(tempfile.gettempdir()))
            log.info("proxy code: %s", self.launcher.label)
        with postgres(self.config.dsn) as admin:
            t0 = time.perf_counter()
            template = f"bench_tpl_{self.tag}"
            create_database(admin, template)
            try:
                with psycopg.connect(db_dsn(admin, template), autocommit=True) as conn:
                    datagen.create_synthetic(conn, sc.rows, sc.groups, self.config.seed)
                    if sc.tpch_sf > 0:
                        datagen.load_tpch(conn, sc.tpch_sf, self.data_dir)
                    stats = DataStats.measure(conn, sc.rows, sc.groups, self.config.seed)
                    row = conn.execute("SHOW server_version").fetchone()
                    pg_version = str(row[0]) if row else "?"
                setup_s = time.perf_counter() - t0
                log.info("data ready in %.1fs: %s", setup_s, stats)
                self._pg_version, self._setup_s = pg_version, setup_s
                runs = self._run_cells(admin, template, stats)
            finally:
                if not self.config.keep_databases:
                    drop_database(admin, template)
        return BenchResult(self.config, stats, runs, self.ops, self.mismatch_details,
                           pg_version, setup_s,
                           self.launcher.label if self.launcher else "not used")

    def _run_cells(self, admin: str, template: str, stats: DataStats) -> list[RunResult]:
        cells = self.plan()
        gen = WorkloadGenerator(stats, self.config.seed, self.config.scale.templates)
        workloads: dict[Combo, list[Op]] = {}
        for combo, _, _ in cells:
            if combo not in workloads:
                workloads[combo] = gen.generate(combo, self.config.scale.ops)
        runs: list[RunResult] = []
        total = sum(len(workloads[c]) for c, _, _ in cells)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), disable=not self.config.progress) as progress:
            task = progress.add_task("bench", total=total)
            for n, (combo, spec, sweep) in enumerate(cells):
                progress.update(task, description=f"{combo.label:>12} {spec.name:<16}")
                dbname = f"bench_{self.tag}_{n}"
                create_database(admin, dbname, template)
                try:
                    result = self._run_one(db_dsn(admin, dbname), combo, spec, sweep,
                                           workloads[combo], lambda: progress.advance(task))
                finally:
                    if not self.config.keep_databases:
                        drop_database(admin, dbname)
                runs.append(result)
                if self.checkpoint is not None:
                    self.checkpoint(BenchResult(
                        self.config, stats, list(runs), list(self.ops),
                        list(self.mismatch_details), self._pg_version, self._setup_s,
                        self.launcher.label if self.launcher else "not used"))
                log.info("%s %s: total %.3fs (q %.3fs, u %.3fs), %d mismatches%s",
                         combo.label, spec.name, result.total_s, result.query_s,
                         result.update_s, result.mismatches,
                         f", ERROR {result.error}" if result.error else "")
        return runs

    def _run_one(self, dsn: str, combo: Combo, spec: SystemSpec, sweep: bool, ops: list[Op],
                 advance: Any) -> RunResult:
        res = RunResult(spec.name, combo.label, combo.ratio, combo.delta, sweep,
                        loadavg_1m=os.getloadavg()[0])
        self._prev_kind = ""
        log_path = self.out_dir / "logs" / f"{combo.label}-{spec.name}.log"
        try:
            assert self.launcher is not None or not spec.via_proxy
            with open_endpoint(spec, dsn, self.launcher, log_path,  # type: ignore[arg-type]
                               self.config.proxy_args) as ep:
                res.configured = ep.configured
                t0 = time.perf_counter()
                for op in ops:
                    self._run_op(ep, res, combo, op)
                    advance()
                res.wall_s = time.perf_counter() - t0
                res.sketches = ep.sketches()
                res.counters = sketch_counters(res.sketches)
                res.proxy_stats = ep.stats()
        except Exception as exc:  # a failed run is reported, the others still run
            log.exception("run %s %s failed", combo.label, spec.name)
            res.error = f"{type(exc).__name__}: {exc}"
        return res

    def _run_op(self, ep: Endpoint, res: RunResult, combo: Combo, op: Op) -> None:
        t0 = time.perf_counter()
        error = ""
        rows: list[tuple[Any, ...]] = []
        nrows = 0
        try:
            cur = execute(ep.conn, op.sql)
            if op.kind == "query":
                rows = cur.fetchall()
                nrows = len(rows)
            else:
                nrows = cur.rowcount
        except psycopg.Error as exc:
            error = f"{type(exc).__name__}: {exc}".strip()
        secs = time.perf_counter() - t0
        match: bool | None = None
        if error:
            res.errors += 1
            if ep.conn.closed:
                raise RuntimeError(f"connection lost at op {op.index}: {error}")
        if op.kind == "query":
            res.n_queries += 1
            res.query_s += secs
            if self._prev_kind == "update":
                res.after_update_n += 1
                res.after_update_s += secs
            if self.config.check and ep.proxy is not None:
                want = execute(ep.direct, op.sql).fetchall()
                cmp = compare(rows, want, op.ordered) if not error else None
                match = bool(cmp and cmp.equal)
                res.checked += 1
                if not match:
                    res.mismatches += 1
                    if len(self.mismatch_details) < MAX_MISMATCH_DETAILS:
                        self.mismatch_details.append({
                            "system": res.system, "combo": combo.label, "op": op.index,
                            "template": op.template, "sql": op.sql,
                            "detail": cmp.detail if cmp else error})
        else:
            res.n_updates += 1
            res.update_s += secs
        self._prev_kind = op.kind
        self.ops.append(OpResult(res.system, combo.label, combo.ratio, combo.delta, op.index,
                                 op.kind, op.template, secs, nrows, match, error))
