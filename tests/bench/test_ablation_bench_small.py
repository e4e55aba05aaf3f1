"""The ablation benchmark at small scale against a real PostgreSQL: every ablation (option on
vs off on its shape) measures every delta size, both sides' maintained sketches contain the
captured one, and the outputs are written. No timing is asserted."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from bench.ablation_bench import ABLATIONS, SCALES, BenchRun, run


@pytest.fixture(scope="module")
def small(db_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[BenchRun, Path]:
    out = tmp_path_factory.mktemp("ablation-bench")
    return run(db_dsn, "small", SCALES["small"], out, "ab"), out


def test_containment_held_on_both_sides(small: tuple[BenchRun, Path]) -> None:
    result, _ = small
    assert [v for r in result.results for v in r.violations] == []
    assert all(m.contained for r in result.results for m in r.measurements)
    assert result.ok
    assert "Containment: all" in result.markdown


def test_a_row_per_configuration(small: tuple[BenchRun, Path]) -> None:
    result, _ = small
    scale = SCALES["small"]
    assert [(r.ablation.option, r.shape.name) for r in result.results] == \
        [(a.option, a.shape) for a in ABLATIONS]
    for r in result.results:
        assert r.error is None, (r.shape.name, r.error)
        assert sorted(m.delta_rows for m in r.measurements) == \
            sorted(d for d in scale.deltas for _ in range(scale.reps))
        assert all(m.on_ms > 0 and m.off_ms > 0 and m.capture_ms > 0 for m in r.measurements)
        assert {m.first for m in r.measurements} == {"on", "off"}  # order alternates
        assert set(r.sides) == {"on", "off"}
        assert all(s.build_ms > 0 and s.json_bytes > 0 for s in r.sides.values())
        assert f"| {r.ablation.option} | {r.shape.name} |" in result.markdown


def test_key_filter_cost_and_effect_measured(small: tuple[BenchRun, Path]) -> None:
    result, _ = small
    joins = [r for r in result.results if r.ablation.option == "join_filter"]
    assert joins and all(r.filter_ms > 0 and r.capture_ms > 0 for r in joins)
    assert sum(m.on_keys_filtered for r in joins for m in r.measurements) > 0
    assert all(m.off_skipped == 0 for r in joins for m in r.measurements)
    assert "Key-filter build cost vs one capture" in result.markdown


def test_outputs_written(small: tuple[BenchRun, Path]) -> None:
    result, out = small
    assert (out / "ab.md").read_text() == result.markdown
    with (out / "ab.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == sum(len(r.measurements) for r in result.results)
    assert {row["option"] for row in rows} == {a.option for a in ABLATIONS}
