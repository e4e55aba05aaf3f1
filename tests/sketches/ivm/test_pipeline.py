"""Pipelines against the real PostgreSQL: random update sequences (inserts, deletes, updates
moving rows across groups and fragments, emptied groups, removed min/max and top-k members,
NULLs, rolled-back and concurrent writers, restarts from persisted state). After every step the
maintained sketch must equal the exact provenance fragments computed with plain SQL in the same
snapshot (which implies maintained ⊇ accurate) and a freshly built state."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

import pg_extensions
from sketches import deltas
from sketches.ivm import partials
from sketches.ivm import state as ivm_state
from sketches.ivm.errors import Invalidated, NotMaintainable, PipelineBroken
from sketches.ivm.pipeline import Pipeline
from sketches.ivm.plan import Options, SketchTarget, compile
from sketches.ranges import RangePartition
from sketches.sql import analyse

Conn = psycopg.Connection[Any]
SETTINGS = settings(max_examples=8, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


def partition(table: str, column: str, bounds: tuple[int, ...]) -> RangePartition:
    literals = tuple(str(b) for b in bounds)
    return RangePartition("public", table, column, "integer", bounds, literals,
                          "{" + ",".join(literals) + "}")


G_PART = partition("s1", "g", (0, 2, 4, 6, 8))
RG_PART = partition("r", "g", (0, 3, 6))
SRID_PART = partition("s", "rid", (3, 6, 9))


@pytest.fixture(scope="module")
def db(db_dsn: str) -> Iterator[str]:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        pg_extensions.install(c)
        c.execute("CREATE TABLE s1 (id int PRIMARY KEY, g int, v int, w numeric)")
        c.execute("CREATE TABLE r (id int PRIMARY KEY, g int, a int)")
        c.execute("CREATE TABLE s (id int PRIMARY KEY, rid int, b int)")
    # tracking commits before any snapshot that builds state
    with psycopg.connect(db_dsn, autocommit=True) as c:
        for t in ("s1", "r", "s"):
            c.execute("SELECT imp.track_table(%s::regclass)", (t,))
    yield db_dsn


@dataclass(frozen=True)
class Case:
    query: str
    targets: tuple[SketchTarget, ...]
    exact: str          # SELECT slot, fragment … : the accurate sketch in plain SQL
    options: Options


def frag(p: RangePartition, alias: str) -> str:
    return p.fragment_sql(sql.Identifier(alias, p.column)).as_string(None)


def groups_sketch(rest: str, where: str = "") -> str:
    """The exact sketch of a query over s1's groups: the fragments of every s1 row (passing
    ``where``) whose group is in ``SELECT t.g FROM s1 t <rest>``."""
    tail = f" WHERE {where}" if where else ""
    return (f"SELECT DISTINCT 0, {frag(G_PART, 'x')} FROM s1 x JOIN (SELECT t.g FROM s1 t {rest})"
            f" h ON x.g IS NOT DISTINCT FROM h.g{tail}")


HAVING = Case(
    "SELECT t.g, sum(t.v), max(t.w), avg(t.v) FROM s1 t GROUP BY t.g"
    " HAVING sum(t.v) > 14 OR max(t.w) >= 6 OR avg(t.v) = 2.5",
    (SketchTarget(0, "g", G_PART),),
    groups_sketch("GROUP BY t.g HAVING sum(t.v) > 14 OR max(t.w) >= 6 OR avg(t.v) = 2.5"),
    Options(minmax_buffer=2, minmax_counts=False))

TOPK_ROWS = Case(
    "SELECT t.id, t.v FROM s1 t WHERE t.v IS NOT NULL ORDER BY t.v DESC, t.id LIMIT 3",
    (SketchTarget(0, "g", G_PART),),
    f"SELECT DISTINCT 0, {frag(G_PART, 'x')} FROM (SELECT t.g FROM s1 t WHERE t.v IS NOT NULL"
    " ORDER BY t.v DESC, t.id FETCH FIRST 3 ROWS WITH TIES) x",
    Options(topk_buffer=4))

TOPK_GROUPS = Case(
    "SELECT t.g, sum(t.v) FROM s1 t GROUP BY t.g ORDER BY sum(t.v) DESC NULLS LAST, t.g LIMIT 2",
    (SketchTarget(0, "g", G_PART),),
    groups_sketch("GROUP BY t.g ORDER BY sum(t.v) DESC NULLS LAST, t.g"
                  " FETCH FIRST 2 ROWS WITH TIES"),
    Options())

TOPK_GROUPS_TIES = Case(
    "SELECT t.g, count(*) FROM s1 t GROUP BY t.g ORDER BY count(*) DESC LIMIT 2",
    (SketchTarget(0, "g", G_PART),),
    groups_sketch("GROUP BY t.g ORDER BY count(*) DESC FETCH FIRST 2 ROWS WITH TIES"),
    Options(topk_buffer=2))

JOIN = Case(
    "SELECT r.g, count(*), sum(s.b), min(s.b) FROM r JOIN s ON s.rid = r.id GROUP BY r.g"
    " HAVING sum(s.b) > 5 OR min(s.b) < 0",
    (SketchTarget(0, "g", RG_PART), SketchTarget(1, "rid", SRID_PART)),
    "WITH q AS (SELECT r.g FROM r JOIN s ON s.rid = r.id GROUP BY r.g"
    "  HAVING sum(s.b) > 5 OR min(s.b) < 0),"
    " j AS (SELECT r.*, s.rid FROM r JOIN s ON s.rid = r.id JOIN q ON r.g IS NOT DISTINCT FROM q.g)"
    f" SELECT DISTINCT 0, {frag(RG_PART, 'r')} FROM j AS r"
    f" UNION SELECT DISTINCT 1, {frag(SRID_PART, 's')} FROM j AS s",
    Options(minmax_buffer=1, join_filter=True, minmax_counts=False))


DISTINCT = Case(
    "SELECT DISTINCT t.v FROM s1 t ORDER BY t.v DESC LIMIT 2",
    (SketchTarget(0, "g", G_PART),),
    f"SELECT DISTINCT 0, {frag(G_PART, 'x')} FROM s1 x JOIN (SELECT DISTINCT t.v FROM s1 t"
    " ORDER BY t.v DESC LIMIT 2) h ON x.v IS NOT DISTINCT FROM h.v",
    Options())

SCALAR = Case(
    "SELECT count(*), max(t.w) FROM s1 t WHERE t.g > 2 HAVING max(t.w) > 3",
    (SketchTarget(0, "g", G_PART),),
    f"SELECT DISTINCT 0, {frag(G_PART, 'x')} FROM s1 x WHERE x.g > 2"
    " AND (SELECT max(t.w) FROM s1 t WHERE t.g > 2) > 3",
    Options(minmax_buffer=1, minmax_counts=False))

JOIN_TOPK = Case(
    "SELECT r.id, s.b FROM r JOIN s ON s.rid = r.id WHERE s.b IS NOT NULL"
    " ORDER BY s.b DESC, s.id LIMIT 3",
    (SketchTarget(0, "g", RG_PART), SketchTarget(1, "rid", SRID_PART)),
    "WITH j AS (SELECT r.g, s.rid FROM r JOIN s ON s.rid = r.id WHERE s.b IS NOT NULL"
    "  ORDER BY s.b DESC, s.id FETCH FIRST 3 ROWS WITH TIES)"
    f" SELECT DISTINCT 0, {frag(RG_PART, 'r')} FROM j AS r"
    f" UNION SELECT DISTINCT 1, {frag(SRID_PART, 's')} FROM j AS s",
    Options(topk_buffer=3))


WHERE_AGG_WHERE = "t.v < 4 AND t.w <> 2"   # NULL v or w: unknown, the row is out
WHERE_AGG = Case(
    f"SELECT t.g, count(*), min(t.w), max(t.v) FROM s1 t WHERE {WHERE_AGG_WHERE}"
    " GROUP BY t.g HAVING count(*) >= 3 OR min(t.w) <= 0",
    (SketchTarget(0, "g", G_PART),),
    groups_sketch(f"WHERE {WHERE_AGG_WHERE} GROUP BY t.g HAVING count(*) >= 3 OR min(t.w) <= 0",
                  "x.v < 4 AND x.w <> 2"),
    Options(pushdown=False, minmax_buffer=None, minmax_counts=False))

WHERE_JOIN_WHERE = "s.b < 5 AND r.a > 2"
WHERE_JOIN = Case(
    "SELECT r.g, count(*), min(s.b) FROM r JOIN s ON s.rid = r.id"
    f" WHERE {WHERE_JOIN_WHERE} GROUP BY r.g HAVING count(*) >= 2 OR min(s.b) < 0",
    (SketchTarget(0, "g", RG_PART), SketchTarget(1, "rid", SRID_PART)),
    "WITH q AS (SELECT r.g FROM r JOIN s ON s.rid = r.id"
    f"  WHERE {WHERE_JOIN_WHERE} GROUP BY r.g HAVING count(*) >= 2 OR min(s.b) < 0),"
    " j AS (SELECT r.*, s.rid FROM r JOIN s ON s.rid = r.id JOIN q ON r.g IS NOT DISTINCT FROM q.g"
    f"  WHERE {WHERE_JOIN_WHERE})"
    f" SELECT DISTINCT 0, {frag(RG_PART, 'r')} FROM j AS r"
    f" UNION SELECT DISTINCT 1, {frag(SRID_PART, 's')} FROM j AS s",
    Options(pushdown=False, join_filter=True, minmax_buffer=1, minmax_counts=False))


def with_options(case: Case, **changes: Any) -> Case:
    return dataclasses.replace(case, options=dataclasses.replace(case.options, **changes))


WHERE_AGG_PUSHED = with_options(WHERE_AGG, pushdown=True)


def exact_sketch(conn: Conn, case: Case) -> tuple[frozenset[int], ...]:
    found: list[set[int]] = [set() for _ in case.targets]
    for slot, f in conn.execute(case.exact.encode()).fetchall():
        found[slot].add(int(f))
    return tuple(frozenset(s) for s in found)


def snapshot_conn(dsn: str) -> Conn:
    c = psycopg.connect(dsn)
    c.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    return c


def build(dsn: str, case: Case) -> Pipeline:
    pipe = compile(analyse(case.query), case.targets, None, case.options)
    with snapshot_conn(dsn) as c:
        pipe.build_state(c)
        assert pipe.sketch() == exact_sketch(c, case)
        c.commit()
    return pipe


def check(dsn: str, pipe: Pipeline, case: Case) -> None:
    """Maintain in a fresh snapshot; compare with the exact sketch and a fresh build there."""
    with snapshot_conn(dsn) as c:
        before = pipe.sketch()
        change = pipe.maintain(c)
        exact = exact_sketch(c, case)
        assert pipe.sketch() == exact
        for slot, frags in enumerate(pipe.sketch()):
            assert frags == (before[slot] | change.added[slot]) - change.removed[slot]
        fresh = compile(analyse(case.query), case.targets, None, case.options)
        fresh.build_state(c)
        assert fresh.sketch() == exact
        c.commit()


maybe = st.one_of(st.none(), st.integers(-3, 9))
S1_OPS = st.one_of(
    st.tuples(st.just("insert"), st.integers(1, 40), maybe, maybe, maybe),
    st.tuples(st.just("delete"), st.integers(1, 40)),
    st.tuples(st.just("move"), st.integers(1, 40), maybe),          # update g
    st.tuples(st.just("revalue"), st.integers(1, 40), maybe, maybe),  # update v, w
    st.tuples(st.just("drop_group"), maybe),
    st.tuples(st.just("drop_max_w"), maybe),
    st.tuples(st.just("drop_top_v"), st.integers(1, 3)),
)


def apply_s1(c: Conn, op: tuple[Any, ...]) -> None:
    kind = op[0]
    if kind == "insert":
        c.execute("INSERT INTO s1 VALUES (%s, %s, %s, %s) ON CONFLICT (id) DO NOTHING", op[1:])
    elif kind == "delete":
        c.execute("DELETE FROM s1 WHERE id = %s", (op[1],))
    elif kind == "move":
        c.execute("UPDATE s1 SET g = %s WHERE id = %s", (op[2], op[1]))
    elif kind == "revalue":
        c.execute("UPDATE s1 SET v = %s, w = %s WHERE id = %s", (op[2], op[3], op[1]))
    elif kind == "drop_group":
        c.execute("DELETE FROM s1 WHERE g IS NOT DISTINCT FROM %s", (op[1],))
    elif kind == "drop_max_w":
        c.execute("DELETE FROM s1 WHERE id IN (SELECT id FROM s1 WHERE g IS NOT DISTINCT FROM %s"
                  " AND w IS NOT NULL ORDER BY w DESC LIMIT 1)", (op[1],))
    elif kind == "drop_top_v":
        c.execute("DELETE FROM s1 WHERE id IN (SELECT id FROM s1 WHERE v IS NOT NULL"
                  " ORDER BY v DESC, id LIMIT %s)", (op[1],))


JOIN_OPS = st.one_of(
    st.tuples(st.just("r_insert"), st.integers(1, 12), maybe, maybe),
    st.tuples(st.just("s_insert"), st.integers(1, 30), st.one_of(st.none(), st.integers(1, 12)),
              maybe),
    st.tuples(st.just("r_delete"), st.integers(1, 12)),
    st.tuples(st.just("s_delete"), st.integers(1, 30)),
    st.tuples(st.just("r_move"), st.integers(1, 12), maybe),
    st.tuples(st.just("s_move"), st.integers(1, 30), st.one_of(st.none(), st.integers(1, 12))),
    st.tuples(st.just("s_drop_min"), st.integers(1, 12)),
    # both sides of one join key in one transaction: exercises −ΔR⋈ΔS
    st.tuples(st.just("pair_insert"), st.integers(9, 14), maybe, st.integers(31, 40), maybe),
    st.tuples(st.just("pair_move"), st.integers(1, 12), maybe, st.integers(1, 30)),
    st.tuples(st.just("pair_delete"), st.integers(1, 12)),
)


# JOIN_OPS plus updates of the columns WHERE_JOIN filters on: rows cross the WHERE both ways
WHERE_JOIN_OPS = st.one_of(
    JOIN_OPS,
    st.tuples(st.just("r_revalue"), st.integers(1, 14), maybe),
    st.tuples(st.just("s_revalue"), st.integers(1, 40), maybe),
)


def apply_join(c: Conn, op: tuple[Any, ...]) -> None:
    kind = op[0]
    if kind == "r_insert":
        c.execute("INSERT INTO r VALUES (%s, %s, %s) ON CONFLICT (id) DO NOTHING", op[1:])
    elif kind == "s_insert":
        c.execute("INSERT INTO s VALUES (%s, %s, %s) ON CONFLICT (id) DO NOTHING", op[1:])
    elif kind == "r_delete":
        c.execute("DELETE FROM r WHERE id = %s", (op[1],))
    elif kind == "s_delete":
        c.execute("DELETE FROM s WHERE id = %s", (op[1],))
    elif kind == "r_move":
        c.execute("UPDATE r SET g = %s WHERE id = %s", (op[2], op[1]))
    elif kind == "s_move":
        c.execute("UPDATE s SET rid = %s WHERE id = %s", (op[2], op[1]))
    elif kind == "pair_insert":
        c.execute("INSERT INTO r VALUES (%s, %s, 0) ON CONFLICT (id) DO NOTHING", op[1:3])
        c.execute("INSERT INTO s VALUES (%s, %s, %s) ON CONFLICT (id) DO NOTHING",
                  (op[3], op[1], op[4]))
    elif kind == "pair_move":
        c.execute("UPDATE r SET g = %s WHERE id = %s", (op[2], op[1]))
        c.execute("UPDATE s SET rid = %s, b = coalesce(b, 0) + 1 WHERE id = %s", (op[1], op[3]))
    elif kind == "pair_delete":
        c.execute("DELETE FROM s WHERE rid = %s", (op[1],))
        c.execute("DELETE FROM r WHERE id = %s", (op[1],))
    elif kind == "r_revalue":
        c.execute("UPDATE r SET a = %s WHERE id = %s", (op[2], op[1]))
    elif kind == "s_revalue":
        c.execute("UPDATE s SET b = %s WHERE id = %s", (op[2], op[1]))
    elif kind == "s_drop_min":
        c.execute("DELETE FROM s WHERE id IN (SELECT s.id FROM s JOIN r ON s.rid = r.id"
                  " WHERE r.g IS NOT DISTINCT FROM (SELECT g FROM r WHERE id = %s)"
                  " AND s.b IS NOT NULL ORDER BY s.b LIMIT 1)", (op[1],))


def reset(dsn: str, tables: tuple[str, ...], seed: Callable[[Conn], None]) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        for t in tables:
            c.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(t)))
        seed(c)


def seed_s1(c: Conn) -> None:
    c.execute("INSERT INTO s1 SELECT i, i % 7 - 1, (i * 5) % 11 - 2, (i * 3) % 7"
              " FROM generate_series(1, 20) AS i")


def seed_join(c: Conn) -> None:
    c.execute("INSERT INTO r SELECT i, i % 5, i FROM generate_series(1, 8) AS i")
    c.execute("INSERT INTO s SELECT i, i % 9 + 1, (i * 7) % 9 - 2 FROM generate_series(1, 20) AS i")


def run_sequence(dsn: str, case: Case, data: st.DataObject, ops: st.SearchStrategy[Any],
                 apply: Callable[[Conn, tuple[Any, ...]], None]) -> None:
    pipe = build(dsn, case)
    pending: list[Conn] = []   # a concurrent writer kept open across a maintenance
    restart_at = data.draw(st.integers(0, 7), label="restart at")
    try:
        for step in range(8):
            batch = data.draw(st.lists(ops, min_size=1, max_size=4), label=f"batch {step}")
            mode = data.draw(st.sampled_from(["commit", "rollback", "concurrent"]), label="mode")
            while pending:            # commit last step's open writer first (row locks)
                w = pending.pop()
                w.commit()
                w.close()
            writer = psycopg.connect(dsn)
            for op in batch:
                apply(writer, op)
            if mode == "commit":
                writer.commit()
                writer.close()
            elif mode == "rollback":
                writer.rollback()
                writer.close()
            else:
                pending.append(writer)  # stays open: invisible to this step's snapshot
            if step == restart_at:
                saved = json.loads(json.dumps(pipe.snapshot()))
                pipe = compile(analyse(case.query), case.targets, None, case.options)
                pipe.restore(saved)
            check(dsn, pipe, case)
        while pending:
            w = pending.pop()
            w.commit()
            w.close()
        check(dsn, pipe, case)
    finally:
        for w in pending:   # a failed check must not leave row locks behind (next example)
            w.close()


FORALL_HAVING = "5 > max(t.w) OR (min(t.v) >= 3 AND count(*) > 1) OR max(t.v) <= 0"
FORALL = Case(
    f"SELECT t.g, count(*) FROM s1 t GROUP BY t.g HAVING {FORALL_HAVING}",
    (SketchTarget(0, "g", G_PART),),
    groups_sketch(f"GROUP BY t.g HAVING {FORALL_HAVING}"),
    Options(minmax_buffer=1, minmax_counts=False))
"""min/max compared so that every value must pass (max <= c, min >= c, a constant on the
left), the forms ``Options.minmax_counts`` maintains as two counts."""


@pytest.mark.parametrize("case", [HAVING, with_options(HAVING, preaggregate=False), TOPK_ROWS,
                                  TOPK_GROUPS, with_options(TOPK_GROUPS, topk_buffer=2),
                                  TOPK_GROUPS_TIES, DISTINCT, SCALAR,
                                  with_options(HAVING, minmax_counts=True),
                                  with_options(HAVING, minmax_counts=True, preaggregate=False),
                                  with_options(SCALAR, minmax_counts=True),
                                  FORALL, with_options(FORALL, minmax_counts=True),
                                  with_options(FORALL, minmax_counts=True, preaggregate=False)],
                         ids=["having", "having-per-row", "topk_rows", "topk_groups",
                              "topk_groups-buffer2", "topk_groups-ties", "distinct", "scalar",
                              "having-counts", "having-counts-per-row", "scalar-counts",
                              "forall", "forall-counts", "forall-counts-per-row"])
@SETTINGS
@given(data=st.data())
def test_single_table_sequences(db: str, case: Case, data: st.DataObject) -> None:
    reset(db, ("s1",), seed_s1)
    run_sequence(db, case, data, S1_OPS, apply_s1)


PREAGG_WHERE = "t.v <> 3"
PREAGG = Case(
    f"SELECT t.g, count(*), count(t.w), sum(t.v), avg(t.w) FROM s1 t WHERE {PREAGG_WHERE}"
    " GROUP BY t.g HAVING sum(t.v) > 14 OR avg(t.w) = 2.5 OR count(t.w) < 2",
    (SketchTarget(0, "g", G_PART),),
    groups_sketch(f"WHERE {PREAGG_WHERE} GROUP BY t.g HAVING sum(t.v) > 14 OR avg(t.w) = 2.5"
                  " OR count(t.w) < 2", "x.v <> 3"),
    Options())


@pytest.mark.parametrize("case", [PREAGG, with_options(PREAGG, preaggregate=False),
                                  with_options(TOPK_GROUPS, preaggregate=False)],
                         ids=["preaggregated", "per-row", "topk-groups-per-row"])
@SETTINGS
@given(data=st.data())
def test_preaggregated_and_per_row_deltas(db: str, case: Case, data: st.DataObject) -> None:
    """count/sum/avg over one table: the delta summed per (group, fragment) in PostgreSQL
    (Options.preaggregate, the default) and row by row must both stay exact (NULL w, rows
    moving across groups, fragments and the WHERE, groups emptied and refilled)."""
    reset(db, ("s1",), seed_s1)
    pipe = compile(analyse(case.query), case.targets, None, case.options)
    assert pipe._preaggregated() == (case.options.preaggregate and case is not TOPK_GROUPS)
    run_sequence(db, case, data, S1_OPS, apply_s1)


@pytest.mark.parametrize("case", [JOIN, with_options(JOIN, join_filter=False), JOIN_TOPK,
                                  with_options(JOIN, join_filter=False, minmax_counts=True),
                                  with_options(JOIN, minmax_counts=True)],
                         ids=["having-filter-per-row", "having-preaggregated", "topk",
                              "having-preaggregated-counts", "having-filter-per-row-counts"])
@settings(SETTINGS, max_examples=12)
@given(data=st.data())
def test_join_sequences(db: str, case: Case, data: st.DataObject) -> None:
    reset(db, ("r", "s"), seed_join)
    run_sequence(db, case, data, JOIN_OPS, apply_join)


JOIN_PREAGG_WHERE = "s.b < 5 AND r.a > 2"
JOIN_PREAGG = Case(
    "SELECT r.g, count(*), sum(s.b), avg(r.a), count(s.b) FROM r JOIN s ON s.rid = r.id"
    f" WHERE {JOIN_PREAGG_WHERE} GROUP BY r.g"
    " HAVING sum(s.b) > 5 OR avg(r.a) < 4 OR count(s.b) < 2",
    (SketchTarget(0, "g", RG_PART), SketchTarget(1, "rid", SRID_PART)),
    "WITH q AS (SELECT r.g FROM r JOIN s ON s.rid = r.id"
    f"  WHERE {JOIN_PREAGG_WHERE} GROUP BY r.g"
    "  HAVING sum(s.b) > 5 OR avg(r.a) < 4 OR count(s.b) < 2),"
    " j AS (SELECT r.*, s.rid FROM r JOIN s ON s.rid = r.id JOIN q ON r.g IS NOT DISTINCT FROM q.g"
    f"  WHERE {JOIN_PREAGG_WHERE})"
    f" SELECT DISTINCT 0, {frag(RG_PART, 'r')} FROM j AS r"
    f" UNION SELECT DISTINCT 1, {frag(SRID_PART, 's')} FROM j AS s",
    Options())

JOIN3_FROM = "r JOIN s ON s.rid = r.id JOIN s1 t ON t.g = r.g"
JOIN3_HAVING = "count(*) > 6 OR sum(t.v) < 0 OR avg(s.b) >= 3"
JOIN3_MATCH = (f"FROM {JOIN3_FROM} JOIN (SELECT r.g FROM {JOIN3_FROM} GROUP BY r.g"
               f" HAVING {JOIN3_HAVING}) q ON r.g IS NOT DISTINCT FROM q.g")
JOIN3_PREAGG = Case(
    f"SELECT r.g, count(*), sum(t.v), avg(s.b) FROM {JOIN3_FROM} GROUP BY r.g"
    f" HAVING {JOIN3_HAVING}",
    (SketchTarget(0, "g", RG_PART), SketchTarget(1, "rid", SRID_PART),
     SketchTarget(2, "g", G_PART)),
    f"SELECT DISTINCT 0, {frag(RG_PART, 'x')} FROM (SELECT r.g {JOIN3_MATCH}) x"
    f" UNION SELECT DISTINCT 1, {frag(SRID_PART, 'y')} FROM (SELECT s.rid {JOIN3_MATCH}) y"
    f" UNION SELECT DISTINCT 2, {frag(G_PART, 'z')} FROM (SELECT t.g {JOIN3_MATCH}) z",
    Options())


def apply_join3(c: Conn, op: tuple[Any, ...]) -> None:
    if op[0] in {"r_insert", "s_insert", "r_delete", "s_delete", "r_move", "s_move",
                 "s_drop_min", "pair_insert", "pair_move", "pair_delete", "r_revalue",
                 "s_revalue"}:
        apply_join(c, op)
    else:
        apply_s1(c, op)


def seed_join3(c: Conn) -> None:
    seed_join(c)
    seed_s1(c)


def test_preaggregated_min_max_values_follow_every_change(db: str) -> None:
    """The group values themselves (not only the sketch) against PostgreSQL's, after each
    change to max(w) read pre-aggregated: new values beyond the 2-value buffer (each group
    of ``seed_s1`` holds one), deletes of the current max until the buffer refills, a new max
    inserted and moved across groups, NULLs, an emptied group."""
    reset(db, ("s1",), seed_s1)
    pipe = build(db, HAVING)
    assert pipe._preaggregated() and pipe.aggregate is not None
    changes = [
        "INSERT INTO s1 VALUES (600, 1, 1, 7), (601, 1, 2, 8), (602, 1, 3, 9), (603, 1, 1, 8)",
        *["DELETE FROM s1 WHERE id IN (SELECT id FROM s1 WHERE g = 1 AND w IS NOT NULL"
          " ORDER BY w DESC, id LIMIT 1)"] * 4,
        "INSERT INTO s1 VALUES (500, 1, 4, 90), (501, 1, NULL, NULL), (502, 2, 1, 90)",
        "UPDATE s1 SET g = 3 WHERE id = 500",
        "UPDATE s1 SET w = NULL WHERE id = 502",
        "DELETE FROM s1 WHERE g = 3",
        "UPDATE s1 SET w = w - 1 WHERE g = 4",
    ]
    refilled = []
    for change in changes:
        with psycopg.connect(db, autocommit=True) as c:
            c.execute(change)
        with snapshot_conn(db) as c:
            pipe.maintain(c)
            refilled.append(pipe.refilled)
            expected = c.execute(
                "SELECT t.g, sum(t.v), max(t.w), avg(t.v) FROM s1 t GROUP BY t.g").fetchall()
            c.commit()
        got = [row for row, _ann, _w in pipe.aggregate.current_output()]
        assert sorted(got, key=repr) == sorted(expected, key=repr), change
    assert refilled[:5] == [0, 0, 0, 1, 0], refilled   # the buffer of 9, 8 ran dry at the 3rd


BIG = Decimal(10) ** 27        # 28 digits: one decimal more is past Python's default context


@pytest.mark.parametrize("having", [f"sum(t.w) > {BIG + Decimal('0.4')}",
                                    f"sum(t.w) + 0.01 > {BIG + Decimal('0.41')}",
                                    f"avg(t.w) > {BIG / 2 + Decimal('0.2')}"],
                         ids=["sum", "sum-plus-constant", "avg"])
@pytest.mark.parametrize("preaggregate", [True, False], ids=["preaggregated", "per-row"])
def test_wide_numeric_sums_stay_exact(db: str, having: str, preaggregate: bool) -> None:
    """Group 1 sums to 10^27, below the HAVING threshold; an insert of 0.45 lifts it above.
    Rounded to Python's default 28 digits the new sum would be 10^27 again: the group would
    still fail HAVING and its fragment would be missing from the sketch (a wrong answer).
    Exact in the state, the pre-aggregated partials, HAVING arithmetic and the average."""
    table = "wide_" + ("p" if preaggregate else "r") + str(abs(hash(having)) % 10_000)
    part = partition(table, "g", (0, 2, 4, 6, 8))
    with psycopg.connect(db, autocommit=True) as c:
        c.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, g int, w numeric)")
                  .format(sql.Identifier(table)))
        c.execute("SELECT imp.track_table(%s::regclass)", (table,))
        c.execute(sql.SQL("INSERT INTO {} VALUES (1, 1, %s), (2, 5, %s)")
                  .format(sql.Identifier(table)), (BIG, 2 * BIG))
    grouped = f"FROM {table} t GROUP BY t.g HAVING {having}"
    case = Case(f"SELECT t.g, count(*) {grouped}", (SketchTarget(0, "g", part),),
                f"SELECT DISTINCT 0, {frag(part, 'x')} FROM {table} x JOIN (SELECT t.g"
                f" {grouped}) h ON x.g IS NOT DISTINCT FROM h.g",
                Options(preaggregate=preaggregate))
    try:
        pipe = build(db, case)
        for change in ("INSERT INTO {} VALUES (3, 1, 0.45)", "UPDATE {} SET w = w + 1 WHERE id = 2",
                       "DELETE FROM {} WHERE id = 3"):
            with psycopg.connect(db, autocommit=True) as c:
                c.execute(sql.SQL(change).format(sql.Identifier(table)))
            check(db, pipe, case)
    finally:
        with psycopg.connect(db, autocommit=True) as c:
            c.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(table)))


@pytest.mark.parametrize("preaggregate", [True, False], ids=["preaggregated", "per-row"])
def test_nan_group_keys_are_refused(db: str, preaggregate: bool) -> None:
    """PostgreSQL puts every NaN in one group; a Python dict never finds a NaN key again (NaN
    is not equal to itself), so each partial or batch would open a group of its own and
    HAVING count(*) > 1 would drop NaN's fragments. Refused (NotMaintainable: the manager
    recaptures) at the build and at the first delta that brings a NaN."""
    table = "nan_p" if preaggregate else "nan_r"
    ident = sql.Identifier(table)
    part = partition(table, "g", (0, 2, 4, 6, 8))
    with psycopg.connect(db, autocommit=True) as c:
        c.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, g int, f float8)").format(ident))
        c.execute("SELECT imp.track_table(%s::regclass)", (table,))
        c.execute(sql.SQL("INSERT INTO {} VALUES (1, 1, 1.5), (2, 1, 1.5), (3, 5, 2.5)")
                  .format(ident))
    query = f"SELECT t.f, count(*) FROM {table} t GROUP BY t.f HAVING count(*) > 1"
    try:
        pipe = compile(analyse(query), [SketchTarget(0, "g", part)], None,
                       Options(preaggregate=preaggregate))
        with snapshot_conn(db) as c:
            pipe.build_state(c)
            c.commit()
        with psycopg.connect(db, autocommit=True) as c:
            c.execute(sql.SQL("INSERT INTO {} VALUES (4, 1, 'NaN'), (5, 7, 'NaN')")
                      .format(ident))
        with snapshot_conn(db) as c, pytest.raises(NotMaintainable, match="NaN"):
            pipe.maintain(c)
        fresh = compile(analyse(query), [SketchTarget(0, "g", part)], None,
                        Options(preaggregate=preaggregate))
        with snapshot_conn(db) as c, pytest.raises(NotMaintainable, match="NaN"):
            fresh.build_state(c)
    finally:
        with psycopg.connect(db, autocommit=True) as c:
            c.execute(sql.SQL("DROP TABLE {}").format(ident))


def test_char_n_comparisons_are_refused(db: str) -> None:
    """char(n) values arrive padded ('ab  ') and PostgreSQL compares them without the blanks
    (``'ab  ' = 'ab'`` is true for char(4)); Python would find the padded group unequal to
    'ab' and drop its fragment. Refused (NotMaintainable: the manager recaptures)."""
    ident = sql.Identifier("chr_n")
    part = partition("chr_n", "g", (0, 2, 4, 6, 8))
    with psycopg.connect(db, autocommit=True) as c:
        c.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, g int, c char(4))").format(ident))
        c.execute("SELECT imp.track_table('chr_n'::regclass)")
        c.execute(sql.SQL("INSERT INTO {} VALUES (1, 1, 'ab'), (2, 5, 'cd')").format(ident))
        assert c.execute("SELECT count(*) FROM chr_n GROUP BY c HAVING c = 'ab'").fetchall() \
            == [(1,)]                                  # PostgreSQL: the padded 'ab' passes
    try:
        pipe = compile(analyse("SELECT t.c, count(*) FROM chr_n t GROUP BY t.c HAVING t.c = 'ab'"),
                       [SketchTarget(0, "g", part)], None, Options())
        with snapshot_conn(db) as c, pytest.raises(NotMaintainable, match="blanks"):
            pipe.build_state(c)
    finally:
        with psycopg.connect(db, autocommit=True) as c:
            c.execute(sql.SQL("DROP TABLE {}").format(ident))


def test_which_deltas_are_read_preaggregated() -> None:
    """Grouped aggregates (min/max too, joins too) unless the WHERE is not pushed down, the
    join key filter is on, the aggregate is scalar, or the query is not an aggregate."""
    def summed(case: Case) -> bool:
        return compile(analyse(case.query), case.targets, None, case.options)._preaggregated()
    assert summed(HAVING) and summed(WHERE_AGG_PUSHED) and summed(JOIN_PREAGG)
    assert summed(with_options(JOIN, join_filter=False)) and summed(JOIN3_PREAGG)
    assert not summed(with_options(HAVING, preaggregate=False))
    assert not summed(JOIN) and not summed(WHERE_AGG) and not summed(SCALAR)
    assert not summed(TOPK_ROWS) and not summed(DISTINCT)


@pytest.mark.parametrize("case", [JOIN_PREAGG, with_options(JOIN_PREAGG, preaggregate=False),
                                  JOIN3_PREAGG, with_options(JOIN3_PREAGG, preaggregate=False)],
                         ids=["2-way-preaggregated", "2-way-per-row",
                              "3-way-preaggregated", "3-way-per-row"])
@settings(SETTINGS, max_examples=10)
@given(data=st.data())
def test_join_preaggregated_and_per_row_deltas(db: str, case: Case,
                                               data: st.DataObject) -> None:
    """count/sum/avg over 2- and 3-way joins: the join's delta evaluated and summed in
    PostgreSQL (every inclusion–exclusion term, incl. −ΔR⋈ΔS from pair_* ops and updates on
    all three tables at once) and the row-by-row path with partner lookups both stay exact."""
    three = case.query == JOIN3_PREAGG.query
    reset(db, ("r", "s", "s1") if three else ("r", "s"), seed_join3 if three else seed_join)
    pipe = compile(analyse(case.query), case.targets, None, case.options)
    assert pipe._preaggregated() == case.options.preaggregate
    ops = st.one_of(WHERE_JOIN_OPS, S1_OPS) if three else WHERE_JOIN_OPS
    run_sequence(db, case, data, ops, apply_join3 if three else apply_join)


UNPUSHED_SINGLE = [WHERE_AGG, with_options(WHERE_AGG, minmax_buffer=1), WHERE_AGG_PUSHED,
                   with_options(SCALAR, pushdown=False),
                   with_options(TOPK_ROWS, pushdown=False),
                   with_options(WHERE_AGG, minmax_counts=True),
                   with_options(WHERE_AGG_PUSHED, minmax_counts=True)]


@pytest.mark.parametrize("case", UNPUSHED_SINGLE,
                         ids=["where-unpushed-all-values", "where-unpushed-buffer1",
                              "where-pushed", "scalar-unpushed", "topk-rows-unpushed",
                              "where-unpushed-counts", "where-pushed-counts"])
@SETTINGS
@given(data=st.data())
def test_where_sequences_with_and_without_pushdown(db: str, case: Case,
                                                   data: st.DataObject) -> None:
    """Options.pushdown off: the delta fetch returns rows failing the WHERE (revalue moves rows
    across ``v < 4 AND w <> 2``, NULLs make it unknown); maintain must drop them itself."""
    reset(db, ("s1",), seed_s1)
    run_sequence(db, case, data, S1_OPS, apply_s1)


UNPUSHED_JOIN = [WHERE_JOIN, with_options(WHERE_JOIN, minmax_buffer=None),
                 with_options(WHERE_JOIN, pushdown=True),
                 with_options(JOIN_TOPK, pushdown=False, join_filter=True),
                 with_options(WHERE_JOIN, minmax_counts=True)]


@pytest.mark.parametrize("case", UNPUSHED_JOIN,
                         ids=["where-unpushed-filter-buffer1", "where-unpushed-filter-all-values",
                              "where-pushed-filter", "topk-unpushed-filter",
                              "where-unpushed-filter-counts"])
@settings(SETTINGS, max_examples=10)
@given(data=st.data())
def test_join_where_sequences_with_and_without_pushdown(db: str, case: Case,
                                                        data: st.DataObject) -> None:
    reset(db, ("r", "s"), seed_join)
    run_sequence(db, case, data, WHERE_JOIN_OPS, apply_join)


def test_unpushed_fetch_carries_rows_failing_the_where(db: str) -> None:
    """Pushdown off really ships the failing rows (with the WHERE value) and drops them in
    Python; the state is the same either way, so the plan fingerprint ignores the option."""
    reset(db, ("s1",), seed_s1)
    pipe = build(db, WHERE_AGG)
    pushed = compile(analyse(WHERE_AGG.query), WHERE_AGG.targets, None,
                     with_options(WHERE_AGG, pushdown=True).options)
    assert pipe.spec.fingerprint() == pushed.spec.fingerprint()
    since = pipe.version
    assert since is not None
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("INSERT INTO s1 VALUES (900, 1, 7, 1), (901, 1, NULL, 1), (902, 1, 0, 2)")
    check(db, pipe, WHERE_AGG)
    assert pipe.applied == 0 and pipe._queries is not None
    with snapshot_conn(db) as c:
        rows = deltas.fetch_query(c, pipe._queries[0], since)
        c.commit()
    assert sorted((r[-2] for r in rows), key=repr) == [False, False, None]
    pushed.restore(json.loads(json.dumps(pipe.snapshot())))
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("UPDATE s1 SET v = 0, w = 0 WHERE id = 900")   # now passes the WHERE
    check(db, pushed, WHERE_AGG)
    assert pushed.applied == 1


def having_variant(case: Case, old: str, new: str) -> Case:
    """``case`` with its HAVING condition ``old`` replaced by ``new`` (query and exact SQL)."""
    assert old in case.query and old in case.exact
    return dataclasses.replace(case, query=case.query.replace(old, new),
                               exact=case.exact.replace(old, new))


def limit_variant(case: Case, k: int) -> Case:
    """``case`` (a top-k over groups with ``LIMIT 2``) with ``k`` instead."""
    assert "LIMIT 2" in case.query and "FETCH FIRST 2 ROWS" in case.exact
    return dataclasses.replace(case, query=case.query.replace("LIMIT 2", f"LIMIT {k}"),
                               exact=case.exact.replace("FETCH FIRST 2 ROWS",
                                                        f"FETCH FIRST {k} ROWS"))


def _havings(old: str, *new: str) -> Callable[[Case], list[Case]]:
    return lambda base: [having_variant(base, old, h) for h in new]


SHARED_CASES: dict[str, tuple[Case, Callable[[Case], list[Case]], st.SearchStrategy[Any],
                              Callable[[Conn, tuple[Any, ...]], None], tuple[str, ...],
                              Callable[[Conn], None]]] = {
    "single": (PREAGG, _havings("sum(t.v) > 14 OR avg(t.w) = 2.5 OR count(t.w) < 2",
                                "sum(t.v) > 4 OR avg(t.w) = 1 OR count(t.w) < 1",
                                "sum(t.v) > 30 OR avg(t.w) = 4 OR count(t.w) < 3"),
               S1_OPS, apply_s1, ("s1",), seed_s1),
    "join": (JOIN_PREAGG, _havings("sum(s.b) > 5 OR avg(r.a) < 4 OR count(s.b) < 2",
                                   "sum(s.b) > 0 OR avg(r.a) < 2 OR count(s.b) < 1",
                                   "sum(s.b) > 12 OR avg(r.a) < 7 OR count(s.b) < 3"),
             JOIN_OPS, apply_join, ("r", "s"), seed_join),
    # k = 1 and 3 read the buffer of k = 2 (3 groups: a larger k raises its refill point)
    "topk": (with_options(TOPK_GROUPS, topk_buffer=3),
             lambda base: [limit_variant(base, 1), limit_variant(base, 3)],
             S1_OPS, apply_s1, ("s1",), seed_s1),
}


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("shape", sorted(SHARED_CASES))
@settings(SETTINGS, max_examples=6)
@given(data=st.data())
def test_heads_share_one_aggregation(db: str, shape: str, fuse: bool,
                                     data: st.DataObject) -> None:
    """Queries differing only in HAVING (or only in the k of a top-k over groups) as heads
    of one pipeline: after every step each head's sketch is the exact sketch of its own
    query, and the state persisted for a head is what a pipeline compiled for that query
    restores and maintains on exactly."""
    base, variants, ops, apply, tables, seed = SHARED_CASES[shape]
    base = with_options(base, fuse_having=fuse)
    cases = variants(base)
    reset(db, tables, seed)
    pipe = build(db, base)
    with snapshot_conn(db) as c:
        pipe.maintain(c)
        heads = [pipe.add_head(compile(analyse(k.query), k.targets, None, k.options).spec)
                 for k in cases]
        for head, k in zip(heads, cases, strict=True):
            assert pipe.sketch(head) == exact_sketch(c, k)
        c.commit()
    for step in range(5):
        batch = data.draw(st.lists(ops, min_size=1, max_size=4), label=f"batch {step}")
        with psycopg.connect(db) as writer:
            for op in batch:
                apply(writer, op)
        check(db, pipe, base)
        with snapshot_conn(db) as c:
            for head, k in zip(heads, cases, strict=True):
                assert pipe.sketch(head) == exact_sketch(c, k), k.query
            c.commit()
    saved = json.loads(json.dumps(pipe.snapshot(heads[1])))
    alone = compile(analyse(cases[1].query), cases[1].targets, None, cases[1].options)
    alone.restore(saved)
    assert alone.sketch() == pipe.sketch(heads[1])
    with psycopg.connect(db, autocommit=True) as w:
        apply(w, data.draw(ops, label="after restore"))
    check(db, alone, cases[1])


def test_persisted_state_resumes_after_restart(db: str) -> None:
    reset(db, ("s1",), seed_s1)
    pipe = build(db, HAVING)
    with psycopg.connect(db, autocommit=True) as c:
        ivm_state.save(c, "having", pipe)
        c.execute("UPDATE s1 SET v = v + 20 WHERE id = 3")
        c.execute("DELETE FROM s1 WHERE g = 0")
    restarted = compile(analyse(HAVING.query), HAVING.targets, None, HAVING.options)
    with psycopg.connect(db, autocommit=True) as c:
        assert ivm_state.load(c, "having", restarted)
        assert ivm_state.oldest_versions(c)
    assert restarted.version == pipe.version
    check(db, restarted, HAVING)
    with psycopg.connect(db, autocommit=True) as c:
        assert ivm_state.delete(c, "having")
        assert not ivm_state.load(c, "having", restarted)


@pytest.mark.parametrize("ddl", [
    ("TRUNCATE s1",), ("ALTER TABLE s1 ADD COLUMN z int", "ALTER TABLE s1 DROP COLUMN z")],
    ids=["truncate", "alter"])
def test_a_state_saved_before_truncate_or_ddl_is_not_loaded(db: str,
                                                            ddl: tuple[str, ...]) -> None:
    """Its table's epoch moved: the state can never be maintained again, so it is not
    decoded only for its first maintenance to fail (``ivm_state.load``)."""
    reset(db, ("s1",), seed_s1)
    pipe = build(db, HAVING)
    with psycopg.connect(db, autocommit=True) as c:
        ivm_state.save(c, "having", pipe)
        for statement in ddl:
            c.execute(statement)
    restarted = compile(analyse(HAVING.query), HAVING.targets, None, HAVING.options)
    with psycopg.connect(db, autocommit=True) as c:
        assert not ivm_state.load(c, "having", restarted)
        assert restarted.version is None
        ivm_state.save(c, "having", build(db, HAVING))   # a state of the new epoch loads
        assert ivm_state.load(c, "having", restarted)
        assert ivm_state.delete(c, "having")


def _maintained_once(db: str, pipe: Pipeline, warm: bool) -> None:
    """``warm``: one maintenance first, so the next one reads its deltas pipelined in one
    round trip (``deltas.read_batch``); else it probes first."""
    if warm:
        with psycopg.connect(db, autocommit=True) as c:
            c.execute("INSERT INTO s1 VALUES (999, 2, 1, 1)"
                      " ON CONFLICT (id) DO UPDATE SET v = s1.v + 1")
        with snapshot_conn(db) as c:
            pipe.maintain(c)
            c.commit()
        assert pipe._queries is not None


@pytest.mark.parametrize("warm", [False, True], ids=["probe-first", "pipelined"])
def test_read_then_apply_is_maintain_and_a_read_alone_changes_nothing(db: str,
                                                                      warm: bool) -> None:
    """``maintain`` split in two: ``read`` (with further statements in the same snapshot)
    leaves the state as it was; ``apply`` of that read maintains exactly; a read taken at
    another version of the state is refused."""
    reset(db, ("s1",), seed_s1)
    pipe = build(db, HAVING)
    _maintained_once(db, pipe, warm)
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("UPDATE s1 SET v = v + 20 WHERE id = 3")
        c.execute("DELETE FROM s1 WHERE g = 0")
    version, sketch = pipe.version, pipe.sketch()
    also = [deltas.Statement("SELECT pg_current_snapshot()::text, count(*) FROM s1"
                             " WHERE id IS DISTINCT FROM %s", (-1,))]
    with snapshot_conn(db) as c:
        read = pipe.read(c, also)
        assert (pipe.version, pipe.sketch()) == (version, sketch)
        count = c.execute("SELECT count(*) FROM s1").fetchone()
        assert read.also == [[(read.snapshot, count[0] if count else None)]]
        pipe.apply(c, read)
        assert pipe.version == read.snapshot != version
        assert pipe.sketch() == exact_sketch(c, HAVING) != sketch
        with pytest.raises(PipelineBroken):
            pipe.apply(c, read)     # read at the old version
        c.commit()
    check(db, pipe, HAVING)


@pytest.mark.parametrize("warm", [False, True], ids=["probe-first", "pipelined"])
def test_delta_reads_keep_the_callers_settings(db: str, warm: bool) -> None:
    """The planner settings of a join's delta reads (deltas.read_settings) are undone: the
    caller's transaction, e.g. a query's own, goes on with its settings and data unchanged."""
    reset(db, ("r", "s"), seed_join)
    pipe = build(db, JOIN_PREAGG)
    _maintained_once(db, pipe, warm)
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("INSERT INTO r VALUES (1001, 2, 5)")
        c.execute("INSERT INTO s VALUES (1001, 1001, 1)")
    names = ("max_parallel_workers_per_gather", "jit", "plan_cache_mode", "enable_nestloop")
    with snapshot_conn(db) as c:
        c.execute("SET LOCAL max_parallel_workers_per_gather = 3")
        c.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        before = [c.execute("SELECT current_setting(%s)", (n,)).fetchone() for n in names]
        pipe.maintain(c)
        assert pipe.applied > 0
        after = [c.execute("SELECT current_setting(%s)", (n,)).fetchone() for n in names]
        assert after == before
        assert c.execute("SELECT count(*) FROM r WHERE id = 1001").fetchone() == (1,)
        c.commit()


def _setup_settings(db: str, pipe: Pipeline, names: tuple[str, ...]
                    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The settings ``names`` as the join delta's setup leaves them, in a fresh snapshot, and
    as they are once the savepoint is undone."""
    assert pipe._queries is not None and pipe._queries[0].setup is not None
    with snapshot_conn(db) as c:
        with deltas.read_settings(c):
            c.execute(pipe._queries[0].setup, {"since": pipe.version})
            during = [c.execute("SELECT current_setting(%s)", (n,)).fetchone() for n in names]
        after = [c.execute("SELECT current_setting(%s)", (n,)).fetchone() for n in names]
        c.commit()
    return (tuple(str(row[0]) for row in during if row is not None),
            tuple(str(row[0]) for row in after if row is not None))


def _nestloop_for_delta(db: str, pipe: Pipeline) -> str:
    return _setup_settings(db, pipe, ("enable_nestloop",))[0][0]


def test_join_delta_setup_plans_the_fetch_for_its_version(db: str) -> None:
    """A join's delta setup turns off parallel workers and JIT for the fetch after it
    (deltas.READ_SETTINGS), and allows a cached generic plan only while every table's delta
    is small (partials.SMALL_DELTA rows) and nested loops stay on: a generic plan guesses a
    third of the audit table, and planning the fetch was half of a small delta's read. The
    settings are undone with the savepoint; the maintained sketch stays exact."""
    reset(db, ("r", "s"), seed_join)
    with psycopg.connect(db, autocommit=True) as c:   # r's delta stays below s's rows / 8
        c.execute("INSERT INTO s SELECT i, i %% 9 + 1, 1 FROM generate_series(100, %s) AS i",
                  (99 + 8 * (partials.SMALL_DELTA + 100),))
        c.execute("ANALYZE r, s")
    pipe = build(db, JOIN_PREAGG)
    with snapshot_conn(db) as c:   # builds the delta queries (partner sizes as of now)
        pipe.maintain(c)
        c.commit()
    names = ("plan_cache_mode", "jit", "max_parallel_workers_per_gather", "enable_nestloop")
    outside = ("force_generic_plan", "on", "1", "on")
    with psycopg.connect(db, autocommit=True) as c:  # what the savepoint must give back
        for n, v in zip(names[:3], outside, strict=False):
            c.execute(sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                sql.Identifier(c.info.dbname), sql.Identifier(n), sql.Literal(v)))
    try:
        with psycopg.connect(db, autocommit=True) as c:
            c.execute("INSERT INTO r SELECT i, i %% 5, 5 FROM generate_series(5001, %s) AS i",
                      (5000 + partials.SMALL_DELTA,))
        assert _setup_settings(db, pipe, names) == (("auto", "off", "0", "on"), outside)
        with psycopg.connect(db, autocommit=True) as c:
            c.execute("INSERT INTO r VALUES (9001, 1, 5)")
        assert _setup_settings(db, pipe, names) == (("force_custom_plan", "off", "0", "on"),
                                                    outside)
    finally:
        with psycopg.connect(db, autocommit=True) as c:
            for n in names[:3]:
                c.execute(sql.SQL("ALTER DATABASE {} RESET {}").format(
                    sql.Identifier(c.info.dbname), sql.Identifier(n)))
    check(db, pipe, JOIN_PREAGG)


def test_join_delta_hashes_small_partners_of_a_large_delta(db: str) -> None:
    """A join's delta read turns nested loops off when every table's delta is at least an
    eighth of its partners' rows (partials.PROBE_COST), and only then: the planner expects
    one row per transaction's xid and would probe the partners once per delta row. The
    maintained sketch stays exact either way."""
    reset(db, ("r", "s"), seed_join)
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("INSERT INTO r SELECT i, i % 5, i FROM generate_series(100, 899) AS i")
        c.execute("ANALYZE r, s")
    pipe = build(db, JOIN_PREAGG)
    with snapshot_conn(db) as c:   # builds the delta queries (partner sizes as of now)
        pipe.maintain(c)
        c.commit()
    with psycopg.connect(db, autocommit=True) as c:   # 5 rows of r (≥ 20 rows of s / 8)
        c.execute("INSERT INTO r SELECT i, i % 5, 4 FROM generate_series(2001, 2005) AS i")
    assert _setup_settings(db, pipe, ("enable_nestloop", "plan_cache_mode"))[0] == (
        "off", "force_custom_plan")  # a generic plan cached here would serve nested loops too
    with psycopg.connect(db, autocommit=True) as c:   # 1 row of s (< 808 rows of r / 8)
        c.execute("INSERT INTO s VALUES (2001, 2001, 1)")
    assert _nestloop_for_delta(db, pipe) == "on"
    check(db, pipe, JOIN_PREAGG)


@pytest.mark.parametrize("warm", [False, True], ids=["probe-first", "pipelined"])
def test_truncate_invalidates(db: str, warm: bool) -> None:
    reset(db, ("s1",), seed_s1)
    pipe = build(db, HAVING)
    _maintained_once(db, pipe, warm)
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("TRUNCATE s1")
    with snapshot_conn(db) as c, pytest.raises(Invalidated):
        pipe.maintain(c)


@pytest.mark.parametrize("warm", [False, True], ids=["probe-first", "pipelined"])
def test_audit_table_rebuilt_after_the_snapshot_invalidates(db: str, warm: bool) -> None:
    """DDL rebuilds the audit table and commits after the query's snapshot was taken: that
    snapshot still reads the old epoch, and the rebuilt audit table's rows are invisible to it,
    so the delta committed before the DDL would be lost without the visibility check."""
    reset(db, ("s1",), seed_s1)
    pipe = build(db, HAVING)
    _maintained_once(db, pipe, warm)
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("INSERT INTO s1 VALUES (1000, 3, 100, 1)")
    with snapshot_conn(db) as q:
        q.execute("SELECT 1")  # the query's snapshot: sees the insert, not the DDL below
        with psycopg.connect(db, autocommit=True) as c:
            c.execute("ALTER TABLE s1 ADD COLUMN rebuilt int")   # other columns: rebuilt
            c.execute("ALTER TABLE s1 DROP COLUMN rebuilt")
        with pytest.raises(Invalidated):
            pipe.maintain(q)


def test_join_filter_skips_lookups_without_partners(db: str) -> None:
    reset(db, ("r", "s"), seed_join)
    pipe = build(db, JOIN)
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("INSERT INTO s VALUES (500, 900, 7)")      # no r with id 900
    check(db, pipe, JOIN)
    assert pipe.stats["lookups_skipped"] >= 1
    with psycopg.connect(db, autocommit=True) as c:       # now give it a partner
        c.execute("INSERT INTO r VALUES (900, 1, 0)")
    check(db, pipe, JOIN)
    off = compile(analyse(JOIN.query), JOIN.targets, None,
                  Options(minmax_buffer=1, join_filter=False))
    with snapshot_conn(db) as c:
        off.build_state(c)
        assert off.filters == [(None, None)] and off.sketch() == pipe.sketch()
        c.commit()


@pytest.mark.parametrize("case", [HAVING, JOIN, SCALAR, WHERE_AGG, WHERE_JOIN, FORALL])
def test_minmax_counts_replace_every_min_max_that_only_having_compares(case: Case) -> None:
    """The sequences above run each of these cases with buffers and with counts: each must
    really be the one it claims."""
    def funcs(options: Options) -> set[str]:
        spec = compile(analyse(case.query), case.targets, None, options).spec
        return {a.func for a in spec.aggs}
    assert funcs(case.options) & {"min", "max"}
    counted = funcs(dataclasses.replace(case.options, minmax_counts=True))
    assert not counted & {"min", "max"} and "count" in counted


def test_the_state_size_is_estimated_from_the_plan(db: str) -> None:
    """The estimate the manager uses to build a large state in the background follows the
    state's (group, fragment) pairs, not the table's rows: 10 groups sketched on their own
    key are about 10 pairs of 20,000 rows; sketched on the id (every group in every one of
    50 fragments) the state holds 500 pairs, which the estimate does not undercut. A query
    without an aggregation has no such estimate."""
    ident = sql.Identifier("est")
    by_g = partition("est", "g", (0, 2, 4, 6, 8))
    by_id = partition("est", "id", tuple(range(400, 20_000, 400)))
    query = "SELECT t.g, sum(t.v) FROM est t GROUP BY t.g HAVING sum(t.v) > 5"
    with psycopg.connect(db, autocommit=True) as c:
        c.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, g int, v int)").format(ident))
        c.execute(sql.SQL("INSERT INTO {} SELECT i, i % 10, i % 7"
                          " FROM generate_series(1, 20000) AS i").format(ident))
        c.execute(sql.SQL("ANALYZE {}").format(ident))
        c.execute("SELECT imp.track_table('est'::regclass)")
    try:
        sizes = {}
        for name, part in (("g", by_g), ("id", by_id)):
            pipe = compile(analyse(query), [SketchTarget(0, part.column, part)], None, Options())
            with snapshot_conn(db) as c:
                estimate = pipe.estimated_groups(c)
                pipe.build_state(c)
                assert pipe.aggregate is not None
                sizes[name] = (estimate,
                               sum(len(g.frags[0]) for g in pipe.aggregate.groups.values()))
        (small, small_built), (large, large_built) = sizes["g"], sizes["id"]
        assert small_built == 10 and large_built == 500
        assert small is not None and small_built / 2 <= small <= small_built * 2
        assert large is not None and large >= large_built
        topk = compile(analyse("SELECT t.id FROM est t ORDER BY t.v DESC, t.id LIMIT 3"),
                       [SketchTarget(0, "g", by_g)], None, Options())
        with snapshot_conn(db) as c:
            assert topk.estimated_groups(c) is None
    finally:
        with psycopg.connect(db, autocommit=True) as c:
            c.execute(sql.SQL("DROP TABLE {}").format(ident))
