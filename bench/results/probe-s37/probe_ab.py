"""Interleaved A/B: the maintenance probe before and after the audit-trigger check, each the
first statement after the one that opens a REPEATABLE READ transaction (see README.md)."""

from __future__ import annotations

import statistics
import time

import psycopg

import pg_extensions
from imp_proxy.embedded import given_or_throwaway as server
from sketches import deltas

AUDIT = ("SELECT relid::oid::int, format('%I.%I', n.nspname, cl.relname)"
         " FROM imp.tracked_tables t JOIN pg_class cl ON cl.oid = t.audit_table"
         " JOIN pg_namespace n ON n.oid = cl.relnamespace")

with server(None) as dsn:
    with psycopg.connect(dsn, autocommit=True) as c:
        pg_extensions.install(c)
        c.execute("CREATE TABLE r (a int, b int)")
        c.execute("INSERT INTO r SELECT g % 1000, g FROM generate_series(1, 100000) g")
        c.execute("SELECT imp.track_table('r'::regclass)")
        row = c.execute(AUDIT).fetchone()
        assert row is not None
        relid, audit = row
    new = deltas._probe_query((relid,), (audit,)).decode()
    old = new.replace(" AND " + deltas.audited("t.relid"), "")
    assert old != new
    variants = {"before": old, "after": new}
    times: dict[str, list[float]] = {k: [] for k in variants}
    with psycopg.connect(dsn, prepare_threshold=0) as c:
        c.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        for rep in range(1000):
            for k, q in (variants.items() if rep % 2 else reversed(variants.items())):
                c.execute("SELECT 1")   # opens the transaction, as the benchmark does
                t0 = time.perf_counter()
                c.execute(q.encode()).fetchall()
                t1 = time.perf_counter()
                c.commit()
                if rep >= 50:
                    times[k].append(t1 - t0)
    for k, v in times.items():
        print(f"{k:8s} median {statistics.median(v) * 1e6:7.1f} us")
    ratio = statistics.median(times["after"]) / statistics.median(times["before"])
    print("after/before", round(ratio, 3))
