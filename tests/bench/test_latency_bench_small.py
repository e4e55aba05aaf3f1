"""The latency benchmark at a tiny size against a real PostgreSQL and a real proxy process:
every (scenario, protocol, system) is timed, every answer through the proxy equals the direct
one, and the counters show which path the proxy took. No timing is asserted."""

from __future__ import annotations

from pathlib import Path

from bench import latency_bench as lb
from bench.machine import machine_facts
from bench.proxy_process import proxied


def test_latency_bench_measures_both_paths(db_dsn: str, tmp_path: Path) -> None:
    threshold = lb._load(db_dsn, 2_000)
    # the background's state persistence commits, which starts a new snapshot: not in here
    with proxied(db_dsn, "--library-setting", "state_interval=3600") as proxy_dsn:
        res = lb.measure(db_dsn, proxy_dsn, threshold, blocks=2, per_block=4)
    assert res.mismatches == []
    assert res.checked == len(lb.SCENARIOS) * len(lb.PROTOCOLS) * 2 * (4 + 5)
    assert set(res.samples) == {(sc, pr, sy) for sc in lb.SCENARIOS for pr in lb.PROTOCOLS
                                for sy in lb.SYSTEMS}
    assert all(len(v) == 2 * 4 and min(v) > 0 for v in res.samples.values())
    unchanged, written = res.counters["unchanged"], res.counters["after a write"]
    # Nothing this test runs commits between the queries, so all come from memory, except
    # that a commit elsewhere in the cluster (autovacuum analysing another test's table)
    # starts a new snapshot: then the next query of each protocol goes to the database.
    missed = unchanged["proxy.used"] - unchanged["proxy.answered_in_memory"]
    assert unchanged["proxy.answered_in_memory"] > 0
    assert 0 <= missed <= len(lb.PROTOCOLS) * res.snapshot_changes["unchanged"], \
        (unchanged, res.snapshot_changes)
    assert res.snapshot_changes["after a write"] > 0
    assert written["proxy.answered_in_memory"] == 0 and written["maintenances"] > 0
    text = lb.report(res, machine_facts(), "python -m bench.latency_bench", 2_000, 2, 4)
    assert "| unchanged | simple |" in text and "mismatches: 0" in text
