"""SketchManager: the proxy's facade, end to end in a client snapshot."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import pg_extensions
from sketches import catalog, cost, lru
from sketches.errors import CaptureError
from sketches.maintained import INSTRUMENTED_CHARS, INSTRUMENTED_KEPT
from sketches.manager import (
    COSTLIER,
    INSTALL_LOCK_WAIT,
    MAX_FRAGMENTS,
    UNREUSED,
    MaintenanceRequest,
    Prepared,
    SketchManager,
    SketchSettings,
)
from sketches.sketch import Sketch

HAVING = "SELECT g, count(*) AS c FROM mt WHERE v >= 0 GROUP BY g HAVING count(*) > $1"


@pytest.fixture(scope="module")
def data(db_dsn: str) -> str:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        # no autovacuum: its ANALYZE commits would count as changes (sketches.freshness)
        catalog.ensure_installed(conn)
        conn.execute("CREATE TABLE mt WITH (autovacuum_enabled = false) AS SELECT i AS id,"
                     " i % 200 AS g, (i * 37) % 101 AS v FROM generate_series(1, 20000) i")
        conn.execute("INSERT INTO mt SELECT 100000 + i, 7, 1 FROM generate_series(1, 500) i")
        conn.execute("CREATE INDEX ON mt (g)")
        conn.execute("CREATE TABLE md WITH (autovacuum_enabled = false) AS SELECT i AS k,"
                     " i % 4 AS cat FROM generate_series(0, 199) i")
    return db_dsn


@pytest.fixture
def svc(data: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(data, autocommit=True) as c:
        yield c


def prepare(m: SketchManager, svc: psycopg.Connection[Any], sql: str,
            params: list[Any] | None = None) -> Prepared:
    svc.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    try:
        return m.prepare(svc, sql, params)
    finally:
        svc.execute("COMMIT")


def rows(conn: psycopg.Connection[Any], sql: str, params: list[Any] | None) -> Counter[Any]:
    with psycopg.RawCursor(conn) as cur:
        cur.execute(sql, params)
        return Counter(cur.fetchall())


def test_capture_then_use_then_recapture_after_a_write(svc: psycopg.Connection[Any]) -> None:
    # own_sketch_after=0: the second run of [300] must refresh (and invalidate) the sketches
    # it reuses, not capture one of its own
    m = SketchManager(SketchSettings(fragments=100, strategy="recapture", own_sketch_after=0))
    first = prepare(m, svc, HAVING, [120])
    assert first.decision == "capture" and first.instrumented_sql is not None
    assert rows(svc, first.instrumented_sql, [120]) == rows(svc, HAVING, [120])
    stricter = prepare(m, svc, HAVING, [300])
    assert stricter.decision == "use" and stricter.sketch_id == first.sketch_id
    assert stricter.instrumented_sql is not None
    assert rows(svc, stricter.instrumented_sql, [300]) == rows(svc, HAVING, [300])
    looser = prepare(m, svc, HAVING, [50])
    assert looser.decision == "capture"
    svc.execute("INSERT INTO mt VALUES (999999, 11, 5)")
    after = prepare(m, svc, HAVING, [300])
    assert after.decision == "capture"
    stats = m.stats()
    assert stats["captures"] == 3 and stats["uses"] == 1 and stats["invalidated"] >= 1
    svc.execute("DELETE FROM mt WHERE id = 999999")


def test_group_7_is_found_by_the_sketch(svc: psycopg.Connection[Any]) -> None:
    m = SketchManager(SketchSettings(fragments=100, persist=False))
    p = prepare(m, svc, HAVING, [200])
    assert p.instrumented_sql is not None and p.sketch_id is not None
    sketch = m.get(p.sketch_id)
    assert sketch is not None and sketch.parts[0].column == "g"
    assert len(sketch.parts[0].fragments) == 1
    assert rows(svc, p.instrumented_sql, [200]) == Counter([(7, 600)])


def test_join_top_k_instrumented_equals_original(svc: psycopg.Connection[Any]) -> None:
    m = SketchManager(SketchSettings(fragments=50, persist=False))
    sql = ("SELECT g, sum(v) AS s FROM mt, md WHERE g = k AND cat = 3 GROUP BY g"
           " ORDER BY s DESC, g LIMIT 3")
    assert m.classify(sql).candidate
    p = prepare(m, svc, sql)
    assert p.decision == "capture" and p.instrumented_sql is not None
    sketch = m.get(p.sketch_id or 0)
    assert sketch is not None and {x.table.alias for x in sketch.parts} == {"mt", "md"}
    with psycopg.RawCursor(svc) as cur:
        assert cur.execute(sql).fetchall() == cur.execute(p.instrumented_sql).fetchall()


def test_classify_is_cached_and_explains(svc: psycopg.Connection[Any]) -> None:
    m = SketchManager(SketchSettings(classify_cache_size=2))
    assert m.classify("SELECT count(*) FROM mt").reason == "scalar aggregate without GROUP BY"
    assert m.classify("SELECT count(*) FROM mt").template is not None
    assert m.stats()["classify_hits"] == 1
    assert m.classify("SELECT 1 FROM mt a LEFT JOIN mt b ON true").reason == \
        "unsupported: outer join"
    m.classify("SELECT g FROM mt ORDER BY g LIMIT 1")
    assert m.stats()["classify_cache"] == 2
    assert m.prepare(svc, "SELECT count(*) FROM mt").decision == "passthrough"


@pytest.mark.parametrize("name", ["state_interval", "batch_interval", "fragments"])
def test_imp_set_refuses_values_that_stop_the_work(name: str) -> None:
    """``IMP SET state_interval = nan`` was taken (``nan <= 0`` is false) and the background's
    ``elapsed >= nan`` was never true: no state saved, no audit row collected, no sketch
    evicted again; ``fragments = 0`` made every capture fail (found by a documentation
    search in session 28; ``inf`` too, found by the regression search after it). Refused now,
    as ``idle_evict_after = nan`` was, and the setting keeps its value. ``fragments =
    10000000000000000000000`` was taken too (found by a helper's search), and the next
    capture of a table without statistics built a list of that many quantiles."""
    m = SketchManager(SketchSettings(persist=False))
    try:
        before = getattr(m.settings, name)
        for bad in (["nan", "inf", "-1"] if name != "fragments"
                    else ["0", "-1", str(MAX_FRAGMENTS + 1), "10000000000000000000000"]):
            with pytest.raises(ValueError):
                m.configure(name, bad)
        assert getattr(m.settings, name) == before
    finally:
        m.close()


def test_long_query_texts_are_cached_within_a_character_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The classification cache holds at most ``lru.MAX_CHARS`` characters of query text, not
    ``classify_cache_size`` texts of any length (found by a resource search in session 26:
    800 distinct queries with 256 KiB comments cost +218 MiB); short texts fill it up to
    the entry bound as before."""
    monkeypatch.setattr(lru, "MAX_CHARS", 1 << 20)
    m = SketchManager(SketchSettings(classify_cache_size=64))
    pad = "x" * (200 << 10)
    for i in range(20):   # 20 texts of 200 KiB: 4 MiB, five fit
        assert m.classify(f"SELECT g, count(*) FROM mt /* {i} {pad} */ GROUP BY g").candidate
        assert m._classified.chars <= 1 << 20
    assert m.stats()["classify_cache"] == 5
    for i in range(100):
        m.classify(f"SELECT g, count(*) FROM mt WHERE g > {i} GROUP BY g")
    assert m.stats()["classify_cache"] == 64


def test_capture_after_n_executions_and_disabled(svc: psycopg.Connection[Any]) -> None:
    m = SketchManager(SketchSettings(fragments=50, capture_after=3, persist=False))
    decisions = [prepare(m, svc, HAVING, [300]).decision for _ in range(4)]
    assert decisions == ["passthrough", "passthrough", "capture", "use"]
    off = SketchManager(SketchSettings(enabled=False))
    assert prepare(off, svc, HAVING, [300]).decision == "passthrough"


SUMS = "SELECT g, sum(v) AS s FROM mt GROUP BY g HAVING sum(v) > $1"


def _sum_quantiles(svc: psycopg.Connection[Any], *qs: float) -> list[int]:
    row = svc.execute("SELECT percentile_disc(%s::float8[]) WITHIN GROUP (ORDER BY s)"
                      " FROM (SELECT sum(v) AS s FROM mt GROUP BY g) AS t", (list(qs),)).fetchone()
    assert row is not None
    return [int(x) for x in row[0]]


def _coverage(m: SketchManager, p: Prepared) -> float:
    sketch = m.get(p.sketch_id or 0)
    assert sketch is not None
    return sum(part.coverage for part in sketch.parts)


@pytest.mark.parametrize("own_after, cap, min_coverage",
                         [(2, 8, 0.02), (0, 8, 0.02), (2, 2, 0.02), (2, 8, 0.95)])
def test_values_use_the_tightest_sketch_and_get_their_own(
        svc: psycopg.Connection[Any], own_after: int, cap: int, min_coverage: float) -> None:
    """A looser instance's sketch, captured later, does not serve a stricter instance that has
    its own; values seen ``own_sketch_after`` times get their own sketch (up to the cap, and
    only instead of a sketch selecting more than ``own_sketch_min_coverage``)."""
    strict, mid, loose = _sum_quantiles(svc, 0.98, 0.9, 0.7)
    m = SketchManager(SketchSettings(fragments=100, persist=False, own_sketch_after=own_after,
                                     max_sketches_per_template=cap,
                                     own_sketch_min_coverage=min_coverage))
    tight = prepare(m, svc, SUMS, [strict])
    broad = prepare(m, svc, SUMS, [loose])
    assert (tight.decision, broad.decision) == ("capture", "capture")
    assert _coverage(m, tight) < _coverage(m, broad)
    again = prepare(m, svc, SUMS, [strict])
    assert (again.decision, again.sketch_id) == ("use", tight.sketch_id)
    runs = [prepare(m, svc, SUMS, [mid]) for _ in range(3)]
    for p in [again, *runs]:
        assert p.instrumented_sql is not None
        assert rows(svc, p.instrumented_sql, p is again and [strict] or [mid]) == \
            rows(svc, SUMS, p is again and [strict] or [mid])
    assert (runs[0].decision, runs[0].sketch_id) == ("use", broad.sketch_id)
    assert 0.02 < _coverage(m, broad) < 0.95
    if own_after and cap > 2 and min_coverage < 0.5:
        assert [p.decision for p in runs[1:]] == ["capture", "use"]
        assert runs[2].sketch_id == runs[1].sketch_id != broad.sketch_id
        assert _coverage(m, runs[1]) < _coverage(m, broad)
    else:
        assert [(p.decision, p.sketch_id) for p in runs[1:]] == [("use", broad.sketch_id)] * 2


def test_large_coverage_is_not_instrumented(svc: psycopg.Connection[Any]) -> None:
    m = SketchManager(SketchSettings(fragments=20, persist=False, max_coverage=0.5))
    p = prepare(m, svc, HAVING, [0])  # every group qualifies
    assert p.decision == "capture" and p.instrumented_sql is None
    assert "of the fragments" in p.reason
    q = prepare(m, svc, HAVING, [300])  # only group 7
    assert q.decision == "capture" and q.instrumented_sql is not None


SCATTERED = ("SELECT g, sum(v) AS s FROM mscatter GROUP BY g HAVING sum(v) > $1")


@pytest.fixture(scope="module")
def scattered(data: str) -> str:
    """200,000 rows in 2,000 groups stored in order, indexed; every other block of four
    groups sums high: a sketch of half the fragments, scattered over the whole table."""
    with psycopg.connect(data, autocommit=True) as c:
        c.execute("CREATE TABLE mscatter WITH (autovacuum_enabled = false) AS SELECT i AS id,"
                  " i % 2000 AS g, CASE WHEN i % 2000 / 4 % 2 = 0 THEN 10 ELSE 1 END AS v"
                  " FROM generate_series(1, 200000) i ORDER BY i % 2000")
        c.execute("CREATE INDEX ON mscatter (g)")
        c.execute("ANALYZE mscatter")
    return data


def test_a_sketch_whose_filter_costs_more_than_it_skips_is_not_used(
        scattered: str, svc: psycopg.Connection[Any]) -> None:
    """A sketch of many scattered fragments made the query slower than PostgreSQL alone (a
    helper's search in session 29: 1.8–3.5× on 1M rows; a 5,000-value IN list 6.25×, JIT
    included). The manager plans both queries and instruments only where PostgreSQL plans
    the instrumented one cheaper; ``compare_cost`` off instruments as before."""
    m = SketchManager(SketchSettings(persist=False))
    broad = prepare(m, svc, SCATTERED, [500])       # half the groups pass
    assert broad.decision == "capture" and broad.instrumented_sql is None, broad.reason
    assert COSTLIER in broad.reason
    assert m.stats()["filters_declined"] == 1
    again = prepare(m, svc, SCATTERED, [500])       # remembered, not planned again
    assert again.decision == "use" and again.instrumented_sql is None
    assert m.stats()["filters_declined"] == 1
    narrow = prepare(m, svc, SCATTERED + " AND g < 8", [500])   # four groups: skipping pays
    assert narrow.instrumented_sql is not None, narrow.reason
    old = SketchManager(SketchSettings(persist=False, compare_cost=False))
    text = prepare(old, svc, SCATTERED, [500]).instrumented_sql
    assert text is not None
    svc.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    try:   # the verdict is PostgreSQL's own: the filter's plan costs more
        before, after = (cost.plan_cost(svc, q, [500]) for q in (SCATTERED, text))
        assert before is not None and after is not None and after >= before
        assert rows(svc, text, [500]) == rows(svc, SCATTERED, [500])
    finally:
        svc.execute("COMMIT")


def test_a_template_whose_sketches_are_never_used_again_captures_at_second_sight(
        svc: psycopg.Connection[Any]) -> None:
    """A query with a new WHERE constant each time was captured each time and its sketch
    never used again: 3.6× slower through the proxy than directly (session 30,
    ``bench/results/unreused-s30``). After ``unreused_captures`` such captures a new
    constant passes through and is captured at its second execution; once one of the
    template's sketches is used again, a new constant is captured at first sight again. A
    sketch that serves a stricter threshold counts as used again."""
    m = SketchManager(SketchSettings(fragments=100, persist=False, unreused_captures=3))
    text = "SELECT g, count(*) AS c FROM mt WHERE v <> {} GROUP BY g HAVING count(*) > 100"
    for k in range(3):
        assert prepare(m, svc, text.format(k)).decision == "capture"
    declined = prepare(m, svc, text.format(3))
    assert declined.decision == "passthrough" and declined.reason == UNREUSED.format(n=3)
    assert declined.instrumented_sql is None and m.stats()["captures_declined"] == 1
    second = prepare(m, svc, text.format(3))
    assert second.decision == "capture" and second.instrumented_sql is not None
    assert rows(svc, second.instrumented_sql, None) == rows(svc, text.format(3), None)
    assert prepare(m, svc, text.format(4)).decision == "passthrough"
    again = prepare(m, svc, text.format(3))
    assert again.decision == "use" and again.sketch_id == second.sketch_id
    assert prepare(m, svc, text.format(5)).decision == "capture"
    assert m.stats()["captures_declined"] == 2
    for k in (6, 7):   # the last three captures again unused after these
        assert prepare(m, svc, text.format(k)).decision == "capture"
    # the proxy asks decline_unpaid first, in its worker thread without a database
    early = m.decline_unpaid(text.format(8), None)
    assert early is not None and early.decision == "passthrough"
    assert early.reason == UNREUSED.format(n=3) and m.stats()["captures_declined"] == 3
    assert m.decline_unpaid(text.format(8), None) is None      # its second execution
    assert prepare(m, svc, text.format(8)).decision == "capture"
    assert m.decline_unpaid("SELECT g FROM mt GROUP BY g HAVING sum(v) > 5", None) is None

    served = SketchManager(SketchSettings(fragments=100, persist=False, unreused_captures=1))
    assert prepare(served, svc, HAVING, [120]).decision == "capture"
    assert prepare(served, svc, HAVING, [300]).decision == "use"      # a stricter threshold
    assert prepare(served, svc, HAVING, [50]).decision == "capture"   # looser: none serves it
    assert prepare(served, svc, HAVING, [40]).decision == "passthrough"
    assert prepare(served, svc, HAVING, [60]).decision == "use"       # [50]'s sketch serves it

    every = SketchManager(SketchSettings(fragments=100, persist=False, unreused_captures=0))
    assert [prepare(every, svc, text.format(k)).decision for k in range(10, 16)] == \
        ["capture"] * 6


def test_admin_listing_and_drop(svc: psycopg.Connection[Any]) -> None:
    m = SketchManager(SketchSettings(fragments=100))
    m.drop_all(svc)  # sketches persisted by earlier tests of this module
    p = prepare(m, svc, HAVING, [250])
    listed = m.sketches()
    assert [r["sketch_id"] for r in listed] == [p.sketch_id]
    assert listed[0]["attributes"] == ["g"] and listed[0]["uses"] == 1
    assert listed[0]["selected_fragments"] == [1] and listed[0]["fragments"] == [101]
    m.flush_counters(svc)
    assert p.sketch_id is not None and m.drop(svc, p.sketch_id)
    assert m.sketches() == []
    prepare(m, svc, HAVING, [250])
    assert m.drop_all(svc) >= 1


def test_persisted_sketch_is_loaded_by_a_new_manager(svc: psycopg.Connection[Any]) -> None:
    class TrustAll:
        name = "trust-all-for-test"

        def refresh(self, conn: psycopg.Connection[Any], sketch: Sketch,
                    request: MaintenanceRequest) -> Sketch | None:
            return sketch

    first = SketchManager(SketchSettings(fragments=100))
    p = prepare(first, svc, HAVING, [260])
    second = SketchManager(SketchSettings(fragments=100), maintenance=TrustAll())
    q = prepare(second, svc, HAVING, [260])
    assert q.decision == "use" and q.sketch_id == p.sketch_id
    assert q.instrumented_sql == p.instrumented_sql


def test_a_new_manager_loads_the_sketches_of_every_search_path(
        svc: psycopg.Connection[Any]) -> None:
    """One text naming a table in each of two schemas has a sketch of each. A new manager
    (a restarted proxy) loaded only those of the search path it met first and captured the
    other's again: a template's catalog sketches are loaded per set of relations."""
    svc.execute("DROP SCHEMA IF EXISTS lp1, lp2 CASCADE")
    for schema, offset in (("lp1", 0), ("lp2", 7)):
        svc.execute(f"CREATE SCHEMA {schema}")
        svc.execute(f"CREATE TABLE {schema}.mp WITH (autovacuum_enabled = false) AS"
                    f" SELECT i AS id, (i + {offset}) % 50 AS g FROM generate_series(1, 2000) i"
                    f" WHERE (i + {offset}) % 50 < 10 OR i % 3 = 0")
    text = "SELECT g, count(*) FROM mp GROUP BY g HAVING count(*) > $1"

    def run(m: SketchManager, schema: str) -> Prepared:
        svc.execute(f"SET search_path = {schema}")
        try:
            return prepare(m, svc, text, [30])
        finally:
            svc.execute("RESET search_path")

    first = SketchManager(SketchSettings(fragments=10))
    captured = {s: run(first, s) for s in ("lp1", "lp2")}
    assert all(p.decision == "capture" for p in captured.values())
    assert captured["lp1"].sketch_id != captured["lp2"].sketch_id
    second = SketchManager(SketchSettings(fragments=10))
    for schema in ("lp1", "lp2"):
        again = run(second, schema)
        assert again.decision == "use", (schema, again.reason)
        assert again.sketch_id == captured[schema].sketch_id
        assert again.instrumented_sql is not None
        svc.execute(f"SET search_path = {schema}")
        try:
            assert rows(svc, again.instrumented_sql, [30]) == rows(svc, text, [30])
        finally:
            svc.execute("RESET search_path")
    assert second.stats().get("captures", 0) == 0


def test_a_query_waits_for_other_work_on_its_template_at_most_template_wait(
        data: str, svc: psycopg.Connection[Any]) -> None:
    """A prepare held its template for as long as its capture or maintenance took, and
    every other query of the template waited for it without bound (found by a helper's
    search: as long as an eager maintenance's statement was held). Here a capture waits for
    a table lock; a second query of its template passes through after ``template_wait``."""
    m = SketchManager(SketchSettings(fragments=100, persist=False, template_wait=0.3))
    out: dict[str, Prepared] = {}
    with psycopg.connect(data, autocommit=True) as locker, \
            psycopg.connect(data, autocommit=True) as other:
        locker.execute("BEGIN")
        locker.execute("LOCK TABLE mt IN ACCESS EXCLUSIVE MODE")
        try:
            first = threading.Thread(target=lambda: out.update(
                first=prepare(m, svc, HAVING, [120])))
            first.start()
            deadline = time.monotonic() + 30
            while other.execute("SELECT EXISTS (SELECT FROM pg_locks WHERE NOT granted"
                                " AND relation = 'mt'::regclass)").fetchone() != (True,):
                assert time.monotonic() < deadline, "the capture never waited for mt"
                time.sleep(0.01)
            second = threading.Thread(target=lambda: out.update(
                second=prepare(m, other, HAVING, [120])))
            second.start()
            second.join(30)
            assert "second" in out, "the second query waited for the first's capture"
        finally:
            locker.execute("ROLLBACK")
        first.join(30)
    assert out["second"].decision == "passthrough"
    assert "template_wait" in out["second"].reason
    assert out["first"].decision == "capture"


def test_maintenance_hook_result_is_used(svc: psycopg.Connection[Any]) -> None:
    calls: list[int] = []

    class Recorder:
        name = "recorder"

        def refresh(self, conn: psycopg.Connection[Any], sketch: Sketch,
                    request: MaintenanceRequest) -> Sketch | None:
            calls.append(len(request.analysis.tables))
            return None  # cannot maintain: the manager must recapture

    m = SketchManager(SketchSettings(fragments=100, persist=False), maintenance=Recorder())
    assert prepare(m, svc, HAVING, [300]).decision == "capture"
    assert prepare(m, svc, HAVING, [300]).decision == "capture"
    assert calls == [1]


def test_column_type_change_rebuilds_the_partition(data: str) -> None:
    with psycopg.connect(data, autocommit=True) as c:
        c.execute("CREATE TABLE ty WITH (autovacuum_enabled = false) AS"
                  " SELECT i AS g, i AS v FROM generate_series(1, 3000) i")
        m = SketchManager(SketchSettings(fragments=30))
        q = "SELECT g, count(*) FROM ty GROUP BY g HAVING sum(v) > 2990"
        assert prepare(m, c, q).decision == "capture"
        c.execute("ALTER TABLE ty ALTER COLUMN g TYPE text USING g::text")
        with pytest.raises(CaptureError):
            prepare(m, c, q)  # the cached integer partition no longer fits
        p = prepare(m, c, q)
        assert p.decision == "capture" and p.instrumented_sql is not None
        assert "AS text" in p.instrumented_sql
        assert rows(c, p.instrumented_sql, None) == rows(c, q, None)


@pytest.mark.parametrize("bad", [{"own_sketch_after": -1}, {"max_sketches_per_template": 0},
                                 {"sketches_kept_per_template": 0},
                                 {"own_sketch_min_coverage": -0.1},
                                 {"own_sketch_min_coverage": 1.5}])
def test_sketch_choice_settings_are_validated(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="own_sketch_after"):
        SketchSettings(**bad)
    SketchSettings(own_sketch_after=0, max_sketches_per_template=1, own_sketch_min_coverage=1.0)


def test_a_capture_whose_transaction_rolls_back_is_forgotten(
        svc: psycopg.Connection[Any]) -> None:
    """The caller's COMMIT failed (INTERFACES §1: it then calls ``rolled_back()``): the
    sketch captured there — exact, but its catalog row is gone — is not used again; the
    next prepare captures a sketch the catalog keeps."""
    query = "SELECT g, max(id) AS m FROM mt GROUP BY g HAVING count(*) > $1"  # no other test's
    m = SketchManager(SketchSettings(fragments=100))
    svc.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    lost = m.prepare(svc, query, [120])
    svc.execute("ROLLBACK")
    m.rolled_back()
    assert lost.decision == "capture" and m.sketches() == []
    again = prepare(m, svc, query, [120])
    assert again.decision == "capture" and again.sketch_id != lost.sketch_id
    assert [r["sketch_id"] for r in m.sketches()] == [again.sketch_id]
    kept = svc.execute("SELECT id FROM imp.sketches WHERE id IN (%s, %s)",
                       (lost.sketch_id, again.sketch_id)).fetchall()
    assert kept == [(again.sketch_id,)]
    used = prepare(m, svc, query, [120])
    assert used.decision == "use" and used.sketch_id == again.sketch_id


@pytest.mark.parametrize(("table", "ktype", "key"), [
    ("kj", "jsonb", "to_jsonb(i % 40)"),
    ("ka", "int[]", "ARRAY[i % 40]"),
    ("kt", "tsvector", "to_tsvector('simple', 'w' || (i % 40))"),
])
def test_a_group_key_python_cannot_order_passes_through(data: str, table: str, ktype: str,
                                                        key: str) -> None:
    """The only group key of such a type is no sketch attribute: the query passes through,
    and the client's transaction stays usable. Found: ``prepare`` raised (jsonb: ``cannot
    cast type smallint[] to jsonb[]``; int[]: ``invalid input syntax for type integer``) in
    the middle of building the range partition, the transaction aborted."""
    query = f"SELECT k, count(*) FROM {table} GROUP BY k HAVING count(*) > 52"  # noqa: S608
    with psycopg.connect(data, autocommit=True) as c:
        c.execute(f"CREATE TABLE {table} (id serial PRIMARY KEY, k {ktype}, v int)")
        c.execute(f"INSERT INTO {table} (k, v) SELECT {key}, i % 7"  # noqa: S608
                  " FROM generate_series(1, 2000) i")
        c.execute(f"INSERT INTO {table} (k, v) SELECT {key}, 1"  # noqa: S608
                  " FROM generate_series(1, 30), (VALUES (7)) AS seven (i)")
        m = SketchManager(SketchSettings(fragments=10))
        try:
            for _ in range(2):
                c.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                try:
                    p = m.prepare(c, query, None)
                    assert len(c.execute(query).fetchall()) == 1   # the transaction is usable
                finally:
                    c.execute("COMMIT")
                assert p.decision == "passthrough" and p.instrumented_sql is None, p
                assert "do not sort" in p.reason, p.reason
        finally:
            m.close()


def test_a_second_group_key_of_an_ordered_type_is_the_sketch_attribute(data: str) -> None:
    """A jsonb group key beside an int one: the sketch is on the int."""
    query = "SELECT k, g, count(*) FROM kg GROUP BY k, g HAVING count(*) > 52"
    with psycopg.connect(data, autocommit=True) as c:
        c.execute("CREATE TABLE kg (id serial PRIMARY KEY, k jsonb, g int)")
        c.execute("INSERT INTO kg (k, g) SELECT to_jsonb(i % 40), i % 40"
                  " FROM generate_series(1, 2000) i")
        c.execute("INSERT INTO kg (k, g) SELECT '7', 7 FROM generate_series(1, 30) i")
        m = SketchManager(SketchSettings(fragments=10))
        try:
            p = prepare(m, c, query)
            assert p.decision == "capture" and p.instrumented_sql is not None, p
            sketch = m.get(p.sketch_id or 0)
            assert sketch is not None and [x.column for x in sketch.parts] == ["g"]
            assert rows(c, p.instrumented_sql, None) == rows(c, query, None)
        finally:
            m.close()


def test_a_capture_holds_no_statistics_lock_while_waiting_for_another_table(data: str) -> None:
    """Another session keeps the join's second table locked ACCESS EXCLUSIVE: the capture,
    which would raise the first table's statistics target and ANALYZE it (SHARE UPDATE
    EXCLUSIVE to its commit) and then wait for the second one without limit, first takes
    ACCESS SHARE on both with a bounded wait: it fails within seconds (the query passes
    through) and leaves no lock on the first table behind, while the other lock is held.
    Without the other lock the capture works, and the caller's lock_timeout is kept."""
    sql = ("SELECT la.g, sum(la.v) AS s FROM la JOIN lb ON la.g = lb.g GROUP BY la.g"
           " HAVING sum(la.v) > 2000000 ORDER BY la.g")
    with psycopg.connect(data, autocommit=True) as c:
        c.execute("CREATE TABLE la WITH (autovacuum_enabled = false) AS"
                  " SELECT i % 100 AS g, i AS v FROM generate_series(1, 20000) i")
        c.execute("CREATE TABLE lb WITH (autovacuum_enabled = false) AS"
                  " SELECT i AS g FROM generate_series(0, 99) i")
    m = SketchManager(SketchSettings(fragments=500, strategy="recapture"))
    outcome: dict[str, Any] = {}
    with psycopg.connect(data) as holder, psycopg.connect(data, autocommit=True) as svc, \
            psycopg.connect(data, autocommit=True) as other:
        holder.execute("LOCK TABLE lb IN ACCESS EXCLUSIVE MODE")

        def run() -> None:
            svc.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            try:
                outcome["prepared"] = m.prepare(svc, sql)
            except psycopg.Error as exc:
                outcome["error"] = exc
            finally:
                svc.execute("ROLLBACK")

        th = threading.Thread(target=run)
        th.start()
        th.join(1.0)   # while the capture waits (if it still does): nothing strong on la
        early = other.execute("SELECT mode FROM pg_locks WHERE relation = 'la'::regclass"
                              " AND mode <> 'AccessShareLock'").fetchall()
        th.join(30)    # generous: the bounded wait is STATISTICS_LOCK_WAIT (2 s)
        if th.is_alive():
            svc.cancel_safe()
            th.join(30)
            pytest.fail(f"the capture waited for lb with these locks on la: {early}")
        assert early == []
        assert isinstance(outcome.get("error"), psycopg.errors.LockNotAvailable), outcome
        with other.transaction():   # still while lb is locked: no strong lock left on la
            other.execute("LOCK TABLE la IN SHARE UPDATE EXCLUSIVE MODE NOWAIT")
        holder.rollback()
    with psycopg.connect(data, autocommit=True) as svc:
        svc.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        svc.execute("SET LOCAL lock_timeout = '7s'")
        p = m.prepare(svc, sql)
        assert p.decision == "capture"
        assert svc.execute("SHOW lock_timeout").fetchone() == ("7s",)
        svc.execute("ROLLBACK")


# ---- bounded resources: sketches per template, instrumented texts ----------------------


def _sized_table(conn: psycopg.Connection[Any], name: str) -> None:
    """Group g (0..199) has 50 + g rows, v numbering them: HAVING count(*) > t keeps the
    groups above t - 50, a few fragments of g."""
    conn.execute(f"DROP TABLE IF EXISTS {name}")
    conn.execute(f"CREATE TABLE {name} (id serial PRIMARY KEY, g int NOT NULL, v int NOT NULL)"
                 " WITH (autovacuum_enabled = false)")
    conn.execute(f"INSERT INTO {name} (g, v) SELECT g, i FROM generate_series(0, 199) g,"
                 " generate_series(1, 50 + g) i")
    conn.execute(f"ANALYZE {name}")


def _valid_rows(conn: psycopg.Connection[Any], table: str) -> set[int]:
    """Ids of the catalog's valid sketches of queries of ``table``."""
    return {int(r[0]) for r in conn.execute(
        "SELECT id FROM imp.sketches WHERE valid AND tables = ARRAY[%s]::text[]",
        (f"public.{table}",)).fetchall()}


def _wait(cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def _held_ids(m: SketchManager) -> set[int]:
    return {int(str(r["sketch_id"])) for r in m.sketches()}


@pytest.mark.parametrize("strategy", ["recapture", "lazy"])
@pytest.mark.parametrize("shape", ["where-constants", "descending-having"])
def test_a_template_keeps_at_most_max_sketches(data: str, strategy: str, shape: str) -> None:
    """Found: every new WHERE constant of one template (an instance no other sketch may
    serve), and every HAVING threshold looser than all before, added a sketch — in memory,
    maintained at every write, in the catalog — for ever (the cap was checked only before a
    capture "of its own"). Now a capture beyond the cap evicts the template's least recently
    used sketch; its catalog row is invalidated, and every answer stays exact."""
    table = f"cap_{strategy}_{shape.split('-')[0]}"
    cap = 4
    # unreused_captures=0: every query is a first sight no sketch serves, captured each time
    m = SketchManager(SketchSettings(fragments=100, strategy=strategy, state_interval=0.2,
                                     sketches_kept_per_template=cap, unreused_captures=0))
    try:
        with psycopg.connect(data, autocommit=True) as svc:
            _sized_table(svc, table)
            if shape == "where-constants":
                text = f"SELECT g, count(*) AS c FROM {table} WHERE v <> {{}} GROUP BY g" \
                       " HAVING count(*) > 235"
                queries = [(text.format(k), None) for k in range(30)]
            else:
                text = f"SELECT g, count(*) AS c FROM {table} GROUP BY g HAVING count(*) > $1"
                queries = [(text, [t]) for t in range(240, 210, -1)]
            captured = set()
            for sql, params in queries:
                p = prepare(m, svc, sql, params)
                assert p.decision == "capture" and p.instrumented_sql is not None
                captured.add(p.sketch_id)
                assert rows(svc, p.instrumented_sql, params) == rows(svc, sql, params)
                assert m.stats()["sketches"] <= cap
            assert len(captured) == len(queries)
            assert m.stats()["evicted"] == len(queries) - cap
            held = _held_ids(m)
            assert len(held) == cap
            # the background invalidates the evicted sketches' rows: the valid ones are those held
            _wait(lambda: _valid_rows(svc, table) == held)
            # the evicted and the kept still answer exactly, also after a write
            svc.execute(f"INSERT INTO {table} (g, v) SELECT 5, i FROM generate_series(1, 300) i")
            for sql, params in (queries[0], queries[-1], queries[len(queries) // 2]):
                p = prepare(m, svc, sql, params)
                assert p.instrumented_sql is not None
                assert rows(svc, p.instrumented_sql, params) == rows(svc, sql, params)
                assert m.stats()["sketches"] <= cap
            _wait(lambda: _valid_rows(svc, table) == _held_ids(m))
    finally:
        m.close()


def test_a_catalog_with_more_sketches_than_the_cap_loads_the_newest(data: str) -> None:
    """A catalog written under a larger cap (or before it was enforced): a new manager loads
    the newest ``sketches_kept_per_template`` and invalidates the others."""
    table = "cap_load"
    text = f"SELECT g, count(*) AS c FROM {table} WHERE v <> {{}} GROUP BY g" \
           " HAVING count(*) > 235"
    first = SketchManager(SketchSettings(fragments=100, strategy="recapture",
                                         sketches_kept_per_template=20, unreused_captures=0))
    second = SketchManager(SketchSettings(fragments=100, strategy="recapture",
                                          sketches_kept_per_template=3, state_interval=0.2))
    try:
        with psycopg.connect(data, autocommit=True) as svc:
            _sized_table(svc, table)
            ids = [prepare(first, svc, text.format(k)).sketch_id for k in range(10)]
            assert _valid_rows(svc, table) == set(ids)
            p = prepare(second, svc, text.format(9))   # loads the newest three: 9 is one
            assert p.decision == "use" and p.sketch_id == ids[-1]
            assert p.instrumented_sql is not None
            assert rows(svc, p.instrumented_sql, None) == rows(svc, text.format(9), None)
            assert _held_ids(second) == {i for i in ids[-3:] if i is not None}
            _wait(lambda: _valid_rows(svc, table) == _held_ids(second))
    finally:
        first.close()
        second.close()


def test_idle_evict_after_is_validated() -> None:
    with pytest.raises(ValueError, match="idle_evict_after"):
        SketchSettings(idle_evict_after=-1)
    with pytest.raises(ValueError, match="idle_evict_after"):
        SketchSettings(idle_evict_after=float("nan"))
    SketchSettings(idle_evict_after=0)


def test_instrumented_texts_kept_per_sketch_are_bounded(
        fresh_db: Callable[[], str]) -> None:
    """Found: one sketch fed texts differing only in a comment (ORM tags) kept every text's
    instrumented copy while the sketch stayed unchanged (~2.5 KiB each, without limit).
    Maintained incrementally, once its table is tracked: under ``recapture`` (or unpersisted,
    so never tracked) any commit elsewhere in the cluster, such as another test's background
    thread, captured the sketch anew mid-loop, and the test failed now and then."""
    dsn = fresh_db()
    m = SketchManager(SketchSettings(fragments=100))
    text = "SELECT g, count(*) AS c FROM mt GROUP BY g HAVING count(*) > 400 /* {} */"
    try:
        with psycopg.connect(dsn, autocommit=True) as svc:
            svc.execute("CREATE TABLE mt AS SELECT i AS id, i % 200 AS g"
                        " FROM generate_series(1, 20000) i")
            svc.execute("INSERT INTO mt SELECT 100000 + i, 7 FROM generate_series(1, 500) i")
            first = prepare(m, svc, text.format("first"))
            assert first.decision == "capture"
            _wait(lambda: svc.execute("SELECT count(*) FROM imp.tracked_tables"
                                      " WHERE relid = 'mt'::regclass").fetchone() == (1,))
            prepare(m, svc, text.format("first"))   # builds the state: tracked in its snapshot
            n = INSTRUMENTED_KEPT + 40
            for i in range(n):
                sql = text.format(i)
                p = prepare(m, svc, sql)
                assert p.decision == "use", (i, p.reason)
                assert p.instrumented_sql is not None
                if i in (0, n - 1):
                    assert rows(svc, p.instrumented_sql, None) == rows(svc, sql, None)
            (entry,) = [e for t in m._templates.values() for e in t.entries]
            assert len(entry.instrumented) == INSTRUMENTED_KEPT
            assert text.format(n - 1) in entry.instrumented   # the newest kept, the oldest gone
            assert text.format(0) not in entry.instrumented
            again = prepare(m, svc, text.format(0))   # a dropped text is instrumented again
            assert again.decision == "use" and again.instrumented_sql is not None
            assert rows(svc, again.instrumented_sql, None) == rows(svc, text.format(0), None)
            for i in range(3):   # long texts: the characters bound the texts kept too
                sql = text.format(f"{i} {'x' * ((3 << 20) // 2)}")
                assert prepare(m, svc, sql).decision == "use"
                assert entry.instrumented.chars <= INSTRUMENTED_CHARS
            assert sql in entry.instrumented and len(entry.instrumented) < INSTRUMENTED_KEPT
    finally:
        m.close()


def test_a_first_query_passes_through_while_another_installs_the_catalog(
        fresh_db: Callable[[], str]) -> None:
    """Two first queries of a database without schema ``imp``, on two threads: the second
    read ``imp.sketches`` while the first one's transaction had installed it but not
    committed, took the missing table for a lost catalog and forgot every sketch held, the
    first one's new sketch too (found by a regression search through two proxies). It now
    passes through, and the first query's sketch is kept."""
    dsn = fresh_db()
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE mt WITH (autovacuum_enabled = false) AS SELECT i AS id,"
                  " i % 200 AS g, (i * 37) % 101 AS v FROM generate_series(1, 20000) i")
        c.execute("INSERT INTO mt SELECT 100000 + i, 7, 1 FROM generate_series(1, 500) i")
        c.execute("ANALYZE mt")
    other = "SELECT g, sum(v) AS s FROM mt GROUP BY g HAVING sum(v) > 6000"
    m = SketchManager(SketchSettings(fragments=10))
    installed, release = threading.Event(), threading.Event()
    first: list[Prepared] = []

    def first_query() -> None:
        with psycopg.connect(dsn, autocommit=True) as a:
            a.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            first.append(m.prepare(a, HAVING, [150]))
            installed.set()
            release.wait(30)
            a.execute("COMMIT")
            m.committed()

    t = threading.Thread(target=first_query)
    t.start()
    try:
        assert installed.wait(30)
        with psycopg.connect(dsn, autocommit=True) as b:
            second = prepare(m, b, other)
    finally:
        release.set()
        t.join(30)
    assert [p.decision for p in first] == ["capture"]
    assert second.decision == "passthrough" and "being installed" in second.reason
    assert m.stats().get("catalog_lost", 0) == 0
    assert [r["sketch_id"] for r in m.sketches()] == [first[0].sketch_id]   # kept
    with psycopg.connect(dsn, autocommit=True) as b:
        assert prepare(m, b, other).decision == "capture"
    assert len(m.sketches()) == 2
    m.close()


def test_templates_without_sketches_are_bounded(svc: psycopg.Connection[Any]) -> None:
    """A template was kept for every query shape classified a candidate, also one that then
    passed through or failed (found by a helper's search of resource bounds in session 26:
    about 0.6 KiB per distinct shape, for ever). Beyond ``classify_cache_size`` the least
    recently used ones without a sketch go; the template with a sketch stays and is used."""
    m = SketchManager(SketchSettings(classify_cache_size=8))
    kept = prepare(m, svc, HAVING, [100])
    assert kept.decision == "capture"
    for i in range(40):   # distinct shapes naming no column of mt: they pass through
        done = prepare(m, svc, f"SELECT g, sum(nosuch_{i}) FROM mt GROUP BY g"
                               f" HAVING sum(nosuch_{i}) > 1")
        assert done.decision == "passthrough"
        assert int(m.stats()["templates"]) <= 8
    assert prepare(m, svc, HAVING, [100]).decision == "use"


def test_a_deferred_install_backs_off_and_is_finished_by_a_background_started_anew(
        data: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An install a query's prepare cannot finish for a lock is left to the background
    thread. Found by a regression search in session 26: that thread's attempt queued an
    ACCESS EXCLUSIVE request for 2 s in every 0.25 s round (holding every reader of the
    table up behind a client's open transaction), and a thread that had ended (server
    unreachable for minutes) was never started again, so queries passed through for ever.
    Now each attempt waits at most INSTALL_LOCK_WAIT, the next one twice as late, and a
    query that finds the install deferred starts the thread."""
    m = SketchManager()
    now = [0.0]
    m._clock = lambda: now[0]
    attempts: list[str | None] = []
    real = catalog.ensure_installed

    def counted(conn: psycopg.Connection[Any], lock_wait: str | None = None) -> bool:
        attempts.append(lock_wait)
        return real(conn, lock_wait)

    monkeypatch.setattr(catalog, "ensure_installed", counted)
    with psycopg.connect(data, autocommit=True) as svc, \
            psycopg.connect(data, autocommit=True) as holder:
        svc.execute("ALTER TABLE imp.sketches DROP COLUMN settings")   # an older catalog
        svc.execute("UPDATE imp.schema_version SET checksum = 'older' WHERE version = 1")
        m._install_deferred = True   # as a prepare blocked by a lock leaves it
        holder.execute("SELECT pg_advisory_lock(%s)", (pg_extensions._LOCK_KEY,))
        try:
            for second in range(12):   # another installer holds its lock throughout
                now[0] = float(second)
                m.install_deferred(svc)
        finally:
            holder.execute("SELECT pg_advisory_unlock(%s)", (pg_extensions._LOCK_KEY,))
        assert attempts == [INSTALL_LOCK_WAIT] * 4   # at 0, 1, 3 and 7 s
        assert m._install_deferred and not catalog.is_installed(svc)
        now[0] = 100.0
        try:
            # no background thread yet (it had ended): the query starts one
            assert prepare(m, svc, HAVING, [100]).decision == "passthrough"
            deadline = time.monotonic() + 30
            while m._install_deferred:
                assert time.monotonic() < deadline, "the background never installed"
                time.sleep(0.05)
            assert catalog.is_installed(svc)
            assert prepare(m, svc, HAVING, [100]).decision in ("capture", "use")
        finally:
            m.close()
