"""Interleaved: the probe before and after the audit-trigger check, first in a REPEATABLE READ transaction."""
import time, statistics, re
import psycopg
import pg_extensions
from sketches import deltas
from imp_proxy.embedded import given_or_throwaway as server
with server(None) as dsn:
    with psycopg.connect(dsn, autocommit=True) as c:
        pg_extensions.install(c)
        c.execute("CREATE TABLE r (a int, b int)")
        c.execute("INSERT INTO r SELECT g % 1000, g FROM generate_series(1, 100000) g")
        c.execute("SELECT imp.track_table('r'::regclass)")
        relid, audit = c.execute("SELECT relid::oid::int, format('%I.%I', n.nspname, cl.relname) FROM imp.tracked_tables t JOIN pg_class cl ON cl.oid = t.audit_table JOIN pg_namespace n ON n.oid = cl.relnamespace").fetchone()
    new = deltas._probe_query((relid,), (audit,)).decode()
    old = new.replace(" AND " + deltas.audited("t.relid"), "")
    assert old != new
    variants = {"before": old, "after": new}
    times = {k: [] for k in variants}
    with psycopg.connect(dsn, prepare_threshold=0) as c:
        c.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        for rep in range(1000):
            for k, q in (variants.items() if rep % 2 else reversed(variants.items())):
                c.execute("SELECT 1")
                t0 = time.perf_counter()
                c.execute(q).fetchall()
                t1 = time.perf_counter()
                c.commit()
                if rep >= 50: times[k].append(t1 - t0)
    for k, v in times.items():
        print(f"{k:8s} median {statistics.median(v)*1e6:7.1f} us")
    print("after/before", round(statistics.median(times["after"]) / statistics.median(times["before"]), 3))
