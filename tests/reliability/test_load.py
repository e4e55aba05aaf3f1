"""Load (issue 7, item 3), the short CI version of ``bench/load_bench.py``: concurrent clients
through the proxy (simple and extended protocol) mixing sketched HAVING/top-k queries, plain
queries and writes, plus writers going straight to PostgreSQL; quiesced rounds compare every
template through the proxy with PostgreSQL. The 32-client, 60-second run is
``python -m bench.load_bench`` (results in bench/results/load_bench.md)."""

from __future__ import annotations

import pytest

from bench.load_bench import LoadConfig, report, run


@pytest.mark.slow
def test_short_load_run(admin_dsn: str) -> None:
    cfg = LoadConfig(clients=10, seconds=9, rows=20_000, direct_writers=3, check_every=3,
                     upstream=admin_dsn)
    res = run(cfg)
    print(report(res, "tests/reliability/test_load.py (LoadConfig above)"))
    assert res.mismatches == []
    assert not res.errors, res.error_samples
    assert res.checks >= 3  # warm-up, at least one during the run, final
    sketched = sum(res.ops[k] for k in ("having-sum", "having-count", "topk-max", "topk-sum"))
    writes = sum(n for k, n in res.ops.items() if k.endswith(("update", "insert", "delete")))
    assert sketched > 0 and writes > 0 and res.ops["point"] + res.ops["group-count"] > 0
    assert int(res.proxy_stats.get("proxy.used", 0)) + \
        int(res.proxy_stats.get("proxy.captured", 0)) > 0, "the sketch path was exercised"
    # memory stays bounded: no sample exceeds the early level by more than a generous margin
    rss = [k for _, k in res.rss]
    assert len(rss) >= 5
    early = max(rss[: max(1, len(rss) // 4)])
    assert max(rss) <= early * 1.5 + 32 * 1024, f"RSS grew from {early} KiB to {max(rss)} KiB"
