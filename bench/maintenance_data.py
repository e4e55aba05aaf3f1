"""Data, query shapes and deltas of the maintenance benchmark (``bench.maintenance_bench``).

The IMP paper's synthetic table (§8), generated inside PostgreSQL with ``generate_series``:
``imp_mb_r(id, a, g50, g5k, g500k, b … k)`` with key ``id``, group id ``a`` uniform in 1..1000,
three further independent group ids (50, 5K and 500K groups — capped at rows/2) and nine int
columns linear in ``a`` plus Gaussian noise. Join partners:

* ``imp_mb_s(sid, x, p, w)`` for 1-n joins ``s.x = r.id``: for selectivity ``p`` % (1, 5, 10)
  two rows per ``r.id`` with ``id % 100 < p`` (so p % of r has partners);
* ``imp_mb_t(tid, a, p, w)`` for m-n joins ``t.a = r.a``: three rows per group value
  ``a % 100 < p`` (so p % of r joins, each r row with 3 t rows).

Query shapes follow the paper's Appendix A.1: GROUP BY/HAVING with 1, 2, 3 and 10 aggregates,
50/1K/5K/500K groups, 1-n and m-n joins at 1/5/10 % selectivity, a top-k over groups and one
over rows, and fragment counts 10 … 5000 (plus ``where-<p>%``, a selective WHERE on r, for the
ablation benchmark only). HAVING thresholds are quantiles of the groups'
aggregate values (computed from the data), so each sketch covers a few percent of the groups.

Deltas are mixed: a third inserts (new ids), a third updates (noise on the value columns, half
of them move to other groups), a third deletes, applied directly in PostgreSQL in one
transaction on ``imp_mb_r``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

log = logging.getLogger(__name__)

Conn = psycopg.Connection[Any]

R, S, T = "imp_mb_r", "imp_mb_s", "imp_mb_t"
A_GROUPS = 1000
SELECTIVITIES = (1, 5, 10)

#: value columns: (name, slope on a, noise sigma)
VALUES: tuple[tuple[str, float, float], ...] = (
    ("b", 10.0, 50.0), ("c", 3.0, 20.0), ("d", 100.0, 1000.0), ("e", 1.0, 5.0),
    ("f", 0.5, 2.0), ("h", 7.0, 100.0), ("i", -4.0, 30.0), ("j", 2.5, 10.0),
    ("k", 20.0, 200.0))

#: the aggregates of the k-aggregate shapes, in order (function, column or None for *)
AGGREGATES: tuple[tuple[str, str | None], ...] = (
    ("sum", "b"), ("avg", "c"), ("max", "d"), ("count", None), ("sum", "e"),
    ("avg", "f"), ("max", "h"), ("sum", "i"), ("avg", "j"), ("max", "k"))

_FUNCTIONS = """
CREATE OR REPLACE FUNCTION imp_mb_normal() RETURNS float8 LANGUAGE sql VOLATILE
RETURN sqrt(-2.0 * ln(1.0 - random())) * cos(2.0 * pi() * random());
"""


@dataclass(frozen=True, slots=True)
class Groups:
    """Group counts of the group columns at a table size."""

    g50: int
    a: int
    g5k: int
    g500k: int

    @classmethod
    def for_rows(cls, rows: int, cap_div: int = 2) -> Groups:
        """Nominal counts, capped at ``rows / cap_div`` (small scales)."""
        cap = max(2, rows // cap_div)
        return cls(min(50, cap), min(A_GROUPS, cap), min(5000, cap), min(500_000, cap))

    def of(self, column: str) -> int:
        return int(getattr(self, column))


@dataclass(frozen=True, slots=True)
class Shape:
    """One query shape: ``sql`` is the query text (constants inlined), ``fragments`` the
    partition size asked of ``build_partition``; ``family`` groups shapes in the report."""

    name: str
    family: str
    sql: str
    fragments: int
    note: str


# ---- data -------------------------------------------------------------------------------

def _rand_group(n: int) -> sql.Composable:
    return sql.SQL("1 + floor(random() * {})::int").format(sql.Literal(n))


def _row_select(groups: Groups, lo: sql.Composable, hi: sql.Composable) -> sql.Composable:
    """SELECT of r rows with ids lo..hi (random groups, values linear in a plus noise)."""
    vals = [sql.SQL("round({} * a + {} * imp_mb_normal())::int").format(
        sql.Literal(slope), sql.Literal(sigma)) for _n, slope, sigma in VALUES]
    return sql.SQL(
        "SELECT id, a, g50, g5k, g500k, {vals} FROM (SELECT i AS id, {ga} AS a, {g50} AS g50,"
        " {g5k} AS g5k, {g500k} AS g500k FROM generate_series({lo}::bigint, {hi}::bigint) AS i)"
        " AS x").format(
        vals=sql.SQL(", ").join(vals), ga=_rand_group(groups.a), g50=_rand_group(groups.g50),
        g5k=_rand_group(groups.g5k), g500k=_rand_group(groups.g500k), lo=lo, hi=hi)


def create_tables(conn: Conn, rows: int, seed: int, cap_div: int = 2) -> Groups:
    """Creates and fills r, s, t (autocommit connection); returns the group counts."""
    groups = Groups.for_rows(rows, cap_div)
    conn.execute(_FUNCTIONS)
    conn.execute(sql.SQL("SELECT setseed({})").format(sql.Literal((seed % 1000) / 1000.0)))
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}, {}, {}").format(
        sql.Identifier(R), sql.Identifier(S), sql.Identifier(T)))
    cols: list[sql.Composable] = [sql.SQL("id bigint PRIMARY KEY"), sql.SQL("a int NOT NULL"),
            sql.SQL("g50 int NOT NULL"), sql.SQL("g5k int NOT NULL"),
            sql.SQL("g500k int NOT NULL")]
    cols += [sql.SQL("{} int NOT NULL").format(sql.Identifier(n)) for n, _s, _g in VALUES]
    conn.execute(sql.SQL("CREATE TABLE {} ({})").format(
        sql.Identifier(R), sql.SQL(", ").join(cols)))
    conn.execute(sql.SQL("INSERT INTO {} {}").format(
        sql.Identifier(R), _row_select(groups, sql.Literal(1), sql.Literal(rows))))
    conn.execute(sql.SQL(
        "CREATE TABLE {} (sid bigserial PRIMARY KEY, x bigint NOT NULL, p int NOT NULL,"
        " w int NOT NULL)").format(sql.Identifier(S)))
    conn.execute(sql.SQL(
        "CREATE TABLE {} (tid bigserial PRIMARY KEY, a int NOT NULL, p int NOT NULL,"
        " w int NOT NULL)").format(sql.Identifier(T)))
    for p in SELECTIVITIES:
        conn.execute(sql.SQL(
            "INSERT INTO {} (x, p, w) SELECT i, {p}, round(50 + 10 * imp_mb_normal())::int"
            " FROM generate_series(1::bigint, {n}::bigint) AS i, generate_series(1, 2) AS m"
            " WHERE i % 100 < {p}").format(sql.Identifier(S), p=sql.Literal(p),
                                           n=sql.Literal(rows)))
        conn.execute(sql.SQL(
            "INSERT INTO {} (a, p, w) SELECT v, {p}, round(50 + 10 * imp_mb_normal())::int"
            " FROM generate_series(1, {n}) AS v, generate_series(1, 3) AS m"
            " WHERE v % 100 < {p}").format(sql.Identifier(T), p=sql.Literal(p),
                                           n=sql.Literal(groups.a)))
    conn.execute(sql.SQL("CREATE INDEX ON {} (x)").format(sql.Identifier(S)))
    conn.execute(sql.SQL("CREATE INDEX ON {} (a)").format(sql.Identifier(T)))
    for t in (R, S, T):
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(t)))
    log.info("data: %s %d rows, groups %s", R, rows, groups)
    return groups


# ---- shapes -----------------------------------------------------------------------------

def _agg(func: str, column: str | None, alias: str = "r") -> sql.Composable:
    if column is None:
        return sql.SQL("count(*)")
    return sql.SQL("{}({})").format(sql.SQL(func), sql.Identifier(alias, column))


def _quantiles(conn: Conn, aggs: Sequence[sql.Composable], from_: sql.Composable,
               group: sql.Composable, q: float) -> list[Any]:
    """The ``q`` quantile of each aggregate's per-group values."""
    names = [sql.Identifier(f"v{i}") for i in range(len(aggs))]
    query = sql.SQL("SELECT {} FROM (SELECT {} {} GROUP BY {}) AS x").format(
        sql.SQL(", ").join(sql.SQL("percentile_disc({}) WITHIN GROUP (ORDER BY {})").format(
            sql.Literal(q), n) for n in names),
        sql.SQL(", ").join(sql.SQL("{} AS {}").format(a, n) for a, n in zip(aggs, names,
                                                                            strict=True)),
        from_, group)
    row = conn.execute(query).fetchone()
    assert row is not None
    return list(row)


def _having_shape(conn: Conn, name: str, family: str, group_col: str, n_aggs: int,
                  fragments: int, note: str) -> Shape:
    group = sql.Identifier("r", group_col)
    aggs = [_agg(f, c) for f, c in AGGREGATES[:n_aggs]]
    from_ = sql.SQL("FROM {} AS r").format(sql.Identifier(R))
    # n aggregates OR-ed: each threshold at 1 - 3%/n, so the union is about 3 % of the groups
    ths = _quantiles(conn, aggs, from_, group, 1.0 - 0.03 / n_aggs)
    having = sql.SQL(" OR ").join(sql.SQL("{} >= {}").format(a, sql.Literal(t))
                                  for a, t in zip(aggs, ths, strict=True))
    query = sql.SQL("SELECT {g}, {aggs} {f} GROUP BY {g} HAVING {h}").format(
        g=group, aggs=sql.SQL(", ").join(aggs), f=from_, h=having)
    return Shape(name, family, query.as_string(conn), fragments, note)


def _join_shape(conn: Conn, kind: str, p: int) -> Shape:
    if kind == "1n":
        other, on = S, sql.SQL("o.x = r.id")
        agg: sql.Composable = sql.SQL("sum(o.w)")
        note = f"r ⋈ s on s.x = r.id (1-2), {p} % of r joins; GROUP BY r.a (1K groups)"
    else:
        other, on = T, sql.SQL("o.a = r.a")
        agg = sql.SQL("sum(r.b)")
        note = f"r ⋈ t on t.a = r.a (m-3), {p} % of r joins; GROUP BY r.a (1K groups)"
    group = sql.Identifier("r", "a")
    from_ = sql.SQL("FROM {} AS r JOIN {} AS o ON {} WHERE o.p = {}").format(
        sql.Identifier(R), sql.Identifier(other), on, sql.Literal(p))
    (th,) = _quantiles(conn, [agg], from_, group, 0.97)
    query = sql.SQL("SELECT {g}, count(*), {agg} {f} GROUP BY {g} HAVING {agg} >= {th}").format(
        g=group, agg=agg, f=from_, th=sql.Literal(th))
    return Shape(f"join-{kind}-{p}%", f"join-{kind}", query.as_string(conn), 1000, note)


def _where_shape(conn: Conn, name: str, pct: int) -> Shape:
    """A selective WHERE on r (``c`` below its ``pct`` % quantile) under GROUP BY a HAVING:
    the shape where pushing the WHERE into the delta fetch matters (``bench.ablation_bench``).
    Not in :func:`all_shape_names` (the maintenance benchmark does not run it)."""
    r = sql.Identifier(R)
    row = conn.execute(sql.SQL("SELECT percentile_disc({}) WITHIN GROUP (ORDER BY c) FROM {}")
                       .format(sql.Literal(pct / 100), r)).fetchone()
    assert row is not None
    group, agg = sql.Identifier("r", "a"), sql.SQL("sum(r.b)")
    from_ = sql.SQL("FROM {} AS r WHERE r.c < {}").format(r, sql.Literal(row[0]))
    (th,) = _quantiles(conn, [agg], from_, group, 0.97)
    query = sql.SQL("SELECT {g}, count(*), {agg} {f} GROUP BY {g} HAVING {agg} >= {th}").format(
        g=group, agg=agg, f=from_, th=sql.Literal(th))
    return Shape(name, "where", query.as_string(conn), 1000,
                 f"WHERE r.c < its {pct} % quantile, GROUP BY r.a HAVING sum(b)")


def all_shape_names() -> list[str]:
    names = [f"groups-{g}" for g in ("50", "1K", "5K", "500K")]
    names += [f"aggs-{n}" for n in (2, 3, 10)]
    names += [f"frags-{n}" for n in (10, 100, 5000)]
    names += [f"join-{k}-{p}%" for k in ("1n", "mn") for p in SELECTIVITIES]
    names += ["topk-groups", "topk-rows"]
    return names


def build_shape(conn: Conn, name: str, groups: Groups) -> Shape:
    """The shape called ``name`` (see :func:`all_shape_names`), thresholds from the data."""
    cols = {"50": "g50", "1K": "a", "5K": "g5k", "500K": "g500k"}
    family, _, arg = name.partition("-")
    if family == "groups":
        col = cols[arg]
        return _having_shape(conn, name, "groups", col, 1, 1000,
                             f"1 aggregate, {groups.of(col)} groups, 1000 fragments")
    if family == "aggs":
        n = int(arg)
        return _having_shape(conn, name, "aggregates", "g5k", n, 1000,
                             f"{n} aggregates OR-ed in HAVING, {groups.g5k} groups")
    if family == "frags":
        n = int(arg)
        return _having_shape(conn, name, "fragments", "g5k", 1, n,
                             f"1 aggregate, {groups.g5k} groups, {n} fragments")
    if family == "join":
        kind, _, pct = arg.partition("-")
        return _join_shape(conn, kind, int(pct.rstrip("%")))
    if family == "where":
        return _where_shape(conn, name, int(arg.rstrip("%")))
    if name == "topk-groups":
        query = sql.SQL("SELECT r.a, sum(r.b) FROM {} AS r GROUP BY r.a"
                        " ORDER BY sum(r.b) DESC, r.a LIMIT 10").format(sql.Identifier(R))
        return Shape(name, "top-k", query.as_string(conn), 1000,
                     f"top-10 groups by sum(b), {groups.a} groups")
    if name == "topk-rows":
        query = sql.SQL("SELECT r.id, r.d FROM {} AS r ORDER BY r.d DESC, r.id LIMIT 10"
                        ).format(sql.Identifier(R))
        return Shape(name, "top-k", query.as_string(conn), 1000,
                     "top-10 rows by d (sketch on d, buffer max(2k, k+64))")
    raise ValueError(f"unknown shape {name!r}")


# ---- deltas -----------------------------------------------------------------------------

@dataclass
class DeltaSource:
    """Applies mixed deltas to r; tracks live ids so deletes and updates hit existing rows."""

    groups: Groups
    live: list[int]
    next_id: int
    rng: random.Random

    @classmethod
    def for_table(cls, rows: int, groups: Groups, seed: int) -> DeltaSource:
        return cls(groups, list(range(1, rows + 1)), rows + 1, random.Random(seed))

    def apply(self, conn: Conn, size: int) -> int:
        """Inserts, updates and deletes ``size`` rows in one committed transaction; returns
        the number of audit rows it produces (an update logs two)."""
        n_ins, n_del = size // 3, size // 3
        n_upd = size - n_ins - n_del
        picked = self.rng.sample(range(len(self.live)), n_del + n_upd)
        ids = [self.live[i] for i in picked]
        dels, upds = ids[:n_del], ids[n_del:]
        for i in sorted(picked[:n_del], reverse=True):
            self.live[i] = self.live[-1]
            self.live.pop()
        lo, hi = self.next_id, self.next_id + n_ins - 1
        self.next_id += n_ins
        self.live.extend(range(lo, hi + 1))
        table = sql.Identifier(R)
        moves = [sql.SQL("{c} = CASE WHEN random() < 0.5 THEN {g} ELSE {c} END").format(
            c=sql.Identifier(c), g=_rand_group(self.groups.of(c)))
            for c in ("a", "g50", "g5k", "g500k")]
        noise = [sql.SQL("{c} = {c} + round({s} * imp_mb_normal())::int").format(
            c=sql.Identifier(n), s=sql.Literal(sigma)) for n, _slope, sigma in VALUES]
        with conn.transaction():
            if dels:
                conn.execute(sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(table), (dels,))
            if upds:
                conn.execute(sql.SQL("UPDATE {} SET {} WHERE id = ANY(%s)").format(
                    table, sql.SQL(", ").join([*moves, *noise])), (upds,))
            if n_ins:
                conn.execute(sql.SQL("INSERT INTO {} {}").format(
                    table, _row_select(self.groups, sql.Literal(lo), sql.Literal(hi))))
        return n_ins + n_del + 2 * n_upd
