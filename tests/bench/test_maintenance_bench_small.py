"""The maintenance benchmark at small scale against a real PostgreSQL: every query shape and
delta size produces a measurement and every maintained sketch contains the freshly captured one.
No timing is asserted."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import psycopg
import pytest

from bench.maintenance_bench import SCALES, BenchRun, run


@pytest.fixture(scope="module")
def small(db_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[BenchRun, Path]:
    out = tmp_path_factory.mktemp("maintenance-bench")
    return run(db_dsn, "small", SCALES["small"], out, "mb"), out


def test_containment_held_everywhere(small: tuple[BenchRun, Path]) -> None:
    result, _ = small
    violations = [(r.shape.name, v) for r in result.results for v in r.violations]
    assert violations == []
    assert all(m.contained for r in result.results for m in r.measurements)
    assert result.ok
    assert "Containment: all" in result.markdown


def test_every_configuration_produced_a_result(small: tuple[BenchRun, Path]) -> None:
    result, _ = small
    scale = SCALES["small"]
    sizes = {*scale.deltas, *(round(f * scale.rows) for f in scale.fractions)}
    assert [r.shape.name for r in result.results] == list(scale.shapes)
    for r in result.results:
        assert r.error is None, (r.shape.name, r.error)
        measured = {m.delta_rows for m in r.measurements}
        assert measured == sizes, r.shape.name
        assert len(r.measurements) == len(sizes) * scale.reps  # reps_large == reps here
        assert all(m.imp_ms > 0 and m.recapture_ms > 0 for m in r.measurements)
        assert r.groups > 0 and r.state_json_bytes > 0 and r.state_heap_bytes > 0


def test_outputs_written(small: tuple[BenchRun, Path]) -> None:
    result, out = small
    assert (out / "mb.md").read_text() == result.markdown
    with (out / "mb.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == sum(len(r.measurements) for r in result.results)
    assert {row["shape"] for row in rows} == set(SCALES["small"].shapes)


def test_gc_held_back_keeps_the_audit_rows(db_dsn: str, tmp_path: Path) -> None:
    """``--gc-held``: the join shapes still maintain exactly while the audit rows of every
    repetition stay (the collection deletes nothing), and the report says so."""
    scale = dataclasses.replace(SCALES["small"], shapes=("join-1n-5%", "join-mn-5%"),
                                deltas=(10, 100), fractions=(), gc_held=True)
    result = run(db_dsn, "small", scale, tmp_path, "held")
    assert result.ok and "GC held back" in result.markdown
    with psycopg.connect(db_dsn) as c:
        audit = c.execute("SELECT audit_table::text FROM imp.tracked_tables"
                          " WHERE relid = 'imp_mb_r'::regclass").fetchone()
        assert audit is not None
        left = c.execute(f"SELECT count(*) FROM {audit[0]}").fetchone()  # noqa: S608
    # two shapes × (10 + 100) mixed rows: at least one audit row per written row stays
    assert left is not None and left[0] >= 2 * (10 + 100)


def test_a_ratio_beside_its_target_never_rounds_across_it() -> None:
    """The targets table printed 9.53× at 1000 rows as "10×", next to "NO" (session 37)."""
    from bench.maintenance_bench import _against
    assert [_against(r, 10) for r in (9.53, 9.4, 10.17, 12.6)] == ["9.5×", "9×", "10×", "13×"]
    assert [_against(r, 100) for r in (99.6, 63.4, 100.2)] == ["99.6×", "63×", "100×"]
