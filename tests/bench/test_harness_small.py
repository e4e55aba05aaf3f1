"""The benchmark harness at small scale, end to end: real PostgreSQL, real proxy subprocess.

Asserts correctness only — every answer through the proxy equals PostgreSQL's, and the proxy's
own counters (``IMP SHOW SKETCHES``) show that sketches were used and incrementally maintained.
No timing is asserted.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from bench.config import SCALES, RunConfig, SystemSpec
from bench.machine import machine_facts
from bench.report import write_all
from bench.runner import Bench, BenchResult, RunResult

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def small_run(admin_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[BenchResult, Path]:
    out = tmp_path_factory.mktemp("bench-small")
    cfg = RunConfig(scale=SCALES["small"], dsn=admin_dsn, run_name="test-small",
                    results_dir=str(out), proxy_code="worktree", progress=False)
    result = Bench(cfg, out, ROOT / "bench" / "data").run()
    write_all(result, out, machine_facts(result.pg_version))
    return result, out


def _runs(result: BenchResult, kind: str) -> list[RunResult]:
    names = {s.name for s in result.config.scale.systems if s.kind == kind}
    return [r for r in result.runs if r.system in names]


def test_every_run_completes_without_errors(small_run: tuple[BenchResult, Path]) -> None:
    result, _ = small_run
    assert result.failed_runs == [], [(r.system, r.combo, r.error) for r in result.failed_runs]
    assert all(r.errors == 0 for r in result.runs), [(r.system, r.combo) for r in result.runs
                                                     if r.errors]
    systems = {r.system for r in result.runs}
    assert {"NS", "FM", "IMP-lazy"} <= systems
    assert any(s.startswith("IMP-eager-") for s in systems)


def test_proxy_answers_equal_postgres(small_run: tuple[BenchResult, Path]) -> None:
    result, _ = small_run
    assert result.mismatches == 0, result.mismatch_details[:5]
    proxied = [r for r in result.runs if r.system != "NS"]
    assert proxied and all(r.checked == r.n_queries > 0 for r in proxied)


def test_sketches_used_and_incrementally_maintained(small_run: tuple[BenchResult, Path]) -> None:
    result, _ = small_run
    for kind in ("lazy", "eager"):
        runs = _runs(result, kind)
        assert runs
        assert sum(r.counters.get("uses", 0) for r in runs) > 0, [r.sketches for r in runs]
        # updates happen between queries of every combo, so maintenance must have happened
        assert sum(r.counters.get("maintenances", 0) for r in runs) > 0, [r.sketches
                                                                          for r in runs]


def test_outputs_written(small_run: tuple[BenchResult, Path]) -> None:
    _, out = small_run
    for name in ("results.json", "runs.csv", "ops.csv", "summary.md", "command.txt",
                 "total_time.png", "maintenance_vs_delta.png"):
        assert (out / name).stat().st_size > 0, name
    doc = json.loads((out / "results.json").read_text())
    assert doc["machine"]["git_commit"] and doc["machine"]["nproc"]
    assert doc["machine"]["postgresql"].startswith("15")


def test_workload_is_deterministic(small_run: tuple[BenchResult, Path]) -> None:
    from bench.workload import WorkloadGenerator

    result, _ = small_run
    combo = result.config.scale.combos()[0]
    a = WorkloadGenerator(result.stats, 7).generate(combo, 30)
    b = WorkloadGenerator(result.stats, 7).generate(combo, 30)
    c = WorkloadGenerator(result.stats, 8).generate(combo, 30)
    assert a == b and a != c
    assert {o.kind for o in a} == {"query", "update"}


def test_system_names_round_trip() -> None:
    for s in (SystemSpec("ns"), SystemSpec("fm"), SystemSpec("lazy"), SystemSpec("eager", 50)):
        assert SystemSpec.parse(s.name) == s
    assert replace(SystemSpec("eager", 1), batch=10).name == "IMP-eager-10"
