"""Mixed workloads of queries and updates (IMP paper §8.1), deterministic by seed.

A workload is a list of operations with their SQL rendered once as text (constants inlined with
``psycopg.sql.Literal``), so every system receives byte-identical statements over the simple query
protocol, and the raw results can show exactly what ran.

Queries are drawn from three templates over the synthetic tables — group-by with HAVING and
varying thresholds, a join of ``r`` with ``s`` with HAVING, and a top-k over an aggregation —
plus, when TPC-H data is loaded, a top-k in the style of TPC-H Q10 (customer ⋈ orders ⋈ lineitem
⋈ nation). Updates insert, delete or update ``delta`` rows of ``r``.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any, cast

import psycopg
from psycopg import sql

from bench.config import RATIOS, Combo
from bench.datagen import R_COLUMNS, noisy_exprs, r_column_names, r_rows_query

log = logging.getLogger(__name__)

#: fractions of groups whose HAVING aggregate exceeds the threshold (varying thresholds)
HAVING_QUANTILES = (0.99, 0.98, 0.95, 0.90)
TOPK_KS = (5, 10, 20)
JOIN_REGION_LIMIT = 5
QUERY_WEIGHTS = {"having": 0.5, "join": 0.25, "topk": 0.25, "tpch-topk": 0.1}
UPDATE_KINDS = ("insert", "delete", "update")


@dataclass(frozen=True, slots=True)
class Op:
    """One operation: a query (``ordered`` when its ORDER BY fixes the row order) or an update."""

    index: int
    kind: str  # "query" | "update"
    template: str  # having | join | topk | tpch-topk | insert | delete | update
    sql: str
    delta: int = 0  # rows per update (0 for queries)
    ordered: bool = False


@dataclass(frozen=True, slots=True)
class DataStats:
    """Facts about the initial data the generator needs (measured once, before any system runs)."""

    rows: int
    groups: int
    seed: int
    max_id: int
    having_thresholds: tuple[int, ...]
    join_thresholds: tuple[int, ...]
    tpch: bool

    @classmethod
    def measure(cls, conn: psycopg.Connection[tuple[object, ...]], rows: int, groups: int,
                seed: int) -> DataStats:
        q = sql.SQL(
            "SELECT percentile_disc({qs}::float8[]) WITHIN GROUP (ORDER BY t.v) FROM "
            "(SELECT sum({col}) AS v FROM r {join} GROUP BY r.a) AS t")
        qs = sql.Literal(list(HAVING_QUANTILES))
        hrow = conn.execute(q.format(qs=qs, col=sql.SQL("r.b"), join=sql.SQL(""))).fetchone()
        jrow = conn.execute(q.format(
            qs=qs, col=sql.SQL("r.c"),
            join=sql.SQL("JOIN s ON r.a = s.x WHERE s.region < {}").format(
                sql.Literal(JOIN_REGION_LIMIT)))).fetchone()
        mrow = conn.execute("SELECT coalesce(max(id), 0) FROM r").fetchone()
        trow = conn.execute("SELECT to_regclass('lineitem') IS NOT NULL").fetchone()
        return cls(rows=rows, groups=groups, seed=seed,
                   max_id=int(cast(int, mrow[0])) if mrow else 0,
                   having_thresholds=_ints(hrow[0] if hrow else []),
                   join_thresholds=_ints(jrow[0] if jrow else []),
                   tpch=bool(trow and trow[0]))

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


def render(q: sql.Composable) -> str:
    return q.as_string(None)


def _ints(values: object) -> tuple[int, ...]:
    return tuple(int(v) for v in cast(list[Any], values))


# ------------------------------------------------------------------------------------ queries

def q_having(threshold: int) -> str:
    return render(sql.SQL(
        "SELECT a, sum(b) AS sb, count(*) AS cnt FROM r GROUP BY a HAVING sum(b) > {}"
    ).format(sql.Literal(threshold)))


def q_join(threshold: int) -> str:
    return render(sql.SQL(
        "SELECT r.a, s.region, sum(r.c) AS sc, count(*) AS cnt FROM r JOIN s ON r.a = s.x "
        "WHERE s.region < {} GROUP BY r.a, s.region HAVING sum(r.c) > {}"
    ).format(sql.Literal(JOIN_REGION_LIMIT), sql.Literal(threshold)))


def q_topk(k: int) -> str:
    return render(sql.SQL(
        "SELECT a, sum(d) AS total, count(*) AS cnt FROM r GROUP BY a "
        "ORDER BY total DESC, a LIMIT {}").format(sql.Literal(k)))


def q_tpch_topk(k: int) -> str:
    return render(sql.SQL(
        "SELECT c.c_custkey, c.c_name, n.n_name, "
        "sum(l.l_extendedprice * (1 - l.l_discount)) AS revenue "
        "FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
        "JOIN lineitem l ON l.l_orderkey = o.o_orderkey "
        "JOIN nation n ON c.c_nationkey = n.n_nationkey "
        "WHERE l.l_returnflag = 'R' "
        "GROUP BY c.c_custkey, c.c_name, n.n_name ORDER BY revenue DESC, c.c_custkey LIMIT {}"
    ).format(sql.Literal(k)))


# ------------------------------------------------------------------------------------ updates

def u_insert(first_id: int, count: int, seed: int, groups: int) -> str:
    names = sql.SQL(", ").join(sql.Identifier(n) for n in r_column_names())
    return render(sql.SQL("INSERT INTO r ({}) {}").format(
        names, r_rows_query(first_id, first_id + count - 1, seed, groups)))


def _pick(start: int, count: int) -> sql.Composed:
    return sql.SQL("SELECT id FROM r WHERE id >= {} ORDER BY id LIMIT {}").format(
        sql.Literal(start), sql.Literal(count))


def u_delete(start: int, count: int) -> str:
    return render(sql.SQL("DELETE FROM r WHERE id IN ({})").format(_pick(start, count)))


def u_update(start: int, count: int, salt: int, groups: int) -> str:
    """Moves ``count`` rows to new pseudo-random groups and redraws their other columns."""
    u = sql.Identifier("u")
    exprs = noisy_exprs(sql.Identifier("id"), sql.Identifier("a"), salt)
    inner = sql.SQL(
        "SELECT id, a, {cols} FROM (SELECT id, bench_a(id, {salt}, {groups}) AS a "
        "FROM ({pick}) AS p) AS t").format(
        cols=sql.SQL(", ").join(sql.SQL("{} AS {}").format(e, sql.Identifier(c.name))
                                for e, c in zip(exprs, R_COLUMNS, strict=True)),
        salt=sql.Literal(salt), groups=sql.Literal(groups), pick=_pick(start, count))
    sets = sql.SQL(", ").join(
        sql.SQL("{} = {}").format(sql.Identifier(n), sql.Identifier("u", n))
        for n in r_column_names()[1:])
    return render(sql.SQL("UPDATE r SET {sets} FROM ({inner}) AS {u} WHERE r.id = u.id").format(
        sets=sets, inner=inner, u=u))


# ---------------------------------------------------------------------------------- workload

@dataclass
class WorkloadGenerator:
    """Builds the operation list for one combo; the same stats + seed + combo give the same list."""

    stats: DataStats
    seed: int
    templates: tuple[str, ...] = ("having", "join", "topk", "tpch-topk")
    _next_id: int = field(init=False, default=0)

    def generate(self, combo: Combo, n_ops: int) -> list[Op]:
        rng = random.Random(f"{self.seed}/{combo.label}")
        self._next_id = self.stats.max_id + 1
        n_upd, n_q = RATIOS[combo.ratio]
        pattern = ["query"] * n_q + ["update"] * n_upd  # queries first: sketches exist early
        templates = [t for t in self.templates if t != "tpch-topk" or self.stats.tpch]
        weights = [QUERY_WEIGHTS[t] for t in templates]
        ops: list[Op] = []
        for i in range(n_ops):
            if pattern[i % len(pattern)] == "query":
                t = rng.choices(templates, weights)[0]
                ops.append(self._query(i, t, rng))
            else:
                ops.append(self._update(i, combo.delta, rng))
        return ops

    def _query(self, i: int, template: str, rng: random.Random) -> Op:
        if template == "having":
            return Op(i, "query", template, q_having(rng.choice(self.stats.having_thresholds)))
        if template == "join":
            return Op(i, "query", template, q_join(rng.choice(self.stats.join_thresholds)))
        if template == "topk":
            return Op(i, "query", template, q_topk(rng.choice(TOPK_KS)), ordered=True)
        if template == "tpch-topk":
            return Op(i, "query", template, q_tpch_topk(20), ordered=True)
        raise ValueError(f"unknown query template {template!r}")

    def _update(self, i: int, delta: int, rng: random.Random) -> Op:
        kind = rng.choice(UPDATE_KINDS)
        g = self.stats.groups
        if kind == "insert":
            text = u_insert(self._next_id, delta, self.stats.seed, g)
            self._next_id += delta
        elif kind == "delete":
            text = u_delete(rng.randint(1, self._next_id), delta)
        else:
            salt = self.seed * 100_003 + i
            text = u_update(rng.randint(1, self._next_id), delta, salt, g)
        return Op(i, "update", kind, text, delta=delta)
