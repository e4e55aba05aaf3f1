"""Random tables and random queries of the supported class, with an independent provenance
oracle: every generated query carries its *lineage* — the flattened FROM/WHERE and the key
expressions that identify which input rows belong to which result row — so a test can compute
the exact provenance without the library's capture query."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import psycopg
from hypothesis import strategies as st

T_COLUMNS = ("g", "n", "s", "d", "ts", "v")

T_ROW = st.tuples(
    st.one_of(st.none(), st.integers(-15, 15), st.sampled_from([3, 3, 3, 7])),
    st.one_of(st.none(), st.decimals(min_value=-500, max_value=500, places=2,
                                     allow_nan=False, allow_infinity=False)),
    st.one_of(st.none(), st.text(alphabet="abcXYZ é", max_size=3)),
    st.one_of(st.none(), st.dates(min_value=date(2019, 1, 1), max_value=date(2021, 12, 31))),
    st.one_of(st.none(), st.datetimes(min_value=datetime(2020, 1, 1),
                                      max_value=datetime(2020, 12, 31))),
    st.one_of(st.none(), st.integers(-100, 100)),
)
DIM_ROW = st.tuples(st.integers(-15, 15), st.sampled_from(["a", "b", "c"]),
                    st.integers(0, 50))


def load_tables(conn: psycopg.Connection[Any], t_rows: Sequence[tuple[Any, ...]],
                dim_rows: Sequence[tuple[Any, ...]]) -> None:
    """(Re)creates ``t`` and ``dim`` with the given rows (ids assigned in order) and ANALYZEs."""
    conn.execute("DROP TABLE IF EXISTS t, dim")
    conn.execute("CREATE TABLE t (id int PRIMARY KEY, g int, n numeric(8,2), s text, d date,"
                 " ts timestamp, v int)")
    conn.execute("CREATE TABLE dim (id int PRIMARY KEY, k int, cat text, w int)")
    with conn.cursor() as cur:
        with cur.copy("COPY t (id, g, n, s, d, ts, v) FROM STDIN") as cp:
            for i, r in enumerate(t_rows):
                cp.write_row((i + 1, *r))
        with cur.copy("COPY dim (id, k, cat, w) FROM STDIN") as cp:
            for i, r in enumerate(dim_rows):
                cp.write_row((i + 1, *r))
    conn.execute("ANALYZE t")
    conn.execute("ANALYZE dim")


@dataclass(frozen=True)
class GenQuery:
    """A generated query and its oracle data.

    ``lineage``: ``FROM … WHERE …`` over the base tables (subqueries flattened);
    ``keys``: expressions over the lineage identifying a result row (group keys, or row ids);
    ``key_positions``: where those values are in the result (of ``ties_sql`` if set);
    ``order_positions``: result positions of the ORDER BY keys; ``determined``: the ORDER BY
    fixes the order and the rows completely."""

    sql: str
    params: list[Any] | None
    lineage: str
    keys: tuple[str, ...]
    key_positions: tuple[int, ...]
    ties_sql: str | None = None
    order_positions: tuple[int, ...] = ()
    determined: bool = False


_D0 = date(2019, 1, 1).toordinal()

_VALUES = {
    "g": lambda r: str(r.randint(-15, 15)),
    "v": lambda r: str(r.randint(-100, 100)),
    "n": lambda r: str(Decimal(r.randint(-50000, 50000)) / 100),
    "s": lambda r: "'" + r.choice(["a", "b", "X", "c", "é", "Z", "ab"]) + "'",
    "d": lambda r: f"DATE '{date.fromordinal(_D0 + r.randint(0, 1000))}'",
    "ts": lambda r: f"TIMESTAMP '2020-{r.randint(1, 12):02d}-{r.randint(1, 28):02d} 12:00'",
}


def _atom(r: random.Random, alias: str = "t") -> str:
    col = r.choice(["g", "v", "n", "s", "d", "ts"])
    ref = f"{alias}.{col}"
    kind = r.randrange(7)
    if kind == 0:
        return f"{ref} {r.choice(['<', '<=', '>', '>=', '=', '<>'])} {_VALUES[col](r)}"
    if kind == 1:
        lo, hi = sorted([_VALUES[col](r), _VALUES[col](r)]) if col in "gvn" else \
            (_VALUES[col](r), _VALUES[col](r))
        return f"{ref} BETWEEN {lo} AND {hi}"
    if kind == 2:
        return f"{ref} IN ({', '.join(_VALUES[col](r) for _ in range(r.randint(1, 4)))})"
    if kind == 3:
        return f"t.s LIKE '{r.choice(['a', 'b', 'X', 'é'])}%'" if alias == "t" else \
            f"{ref} IS NOT NULL"
    if kind == 4:
        return f"{ref} IS {r.choice(['', 'NOT '])}NULL"
    if kind == 5:
        return f"NOT ({ref} = {_VALUES[col](r)})"
    return f"({_atom(r, alias)} OR {_atom(r, alias)})"


def predicate(r: random.Random, alias: str = "t") -> str | None:
    n = r.choice([0, 0, 1, 1, 2])
    if n == 0:
        return None
    return " AND ".join(_atom(r, alias) for _ in range(n))


AGGS = ["count(*)", "count(t.v)", "sum(t.v)", "avg(t.n)", "min(t.d)", "max(t.s)",
        "sum(t.v + t.g)", "count(DISTINCT t.s)", "max(t.ts)"]


def _having(r: random.Random, params: list[Any]) -> str:
    choice = r.randrange(6)
    if choice == 0:
        c = r.randint(0, 4)
        if r.random() < 0.4:
            params.append(c)
            return f"count(*) > ${len(params)}"
        return f"count(*) > {c}"
    if choice == 1:
        return f"sum(t.v) {r.choice(['>', '<', '>='])} {r.randint(-100, 150)}"
    if choice == 2:
        return f"max(t.s) < '{r.choice(['a', 'b', 'c', 'é'])}'"
    if choice == 3:
        return f"avg(t.n) >= {r.randint(-300, 300)}"
    if choice == 4:
        return f"min(t.d) < DATE '2020-0{r.randint(1, 9)}-01'"
    return f"count(*) >= {r.randint(1, 3)} AND sum(t.v) > {r.randint(-50, 50)}"


def _where(*parts: str | None) -> str:
    conj = [p for p in parts if p]
    return f" WHERE {' AND '.join(conj)}" if conj else ""


def generate(r: random.Random) -> GenQuery:
    """One random query of the supported class."""
    kind = r.choice(["having", "having", "group_topk", "rows_topk", "rows_topk", "distinct",
                     "join", "subquery", "join_topk", "join_rows", "join_unqualified",
                     "subquery_join"])
    pred = predicate(r)
    params: list[Any] = []
    if kind == "having":
        keys = r.choice([["t.g"], ["t.s"], ["t.d"], ["t.n"], ["t.g", "t.s"]])
        agg = r.choice(AGGS)
        having = _having(r, params)
        sql = (f"SELECT {', '.join(keys)}, {agg} AS m FROM t{_where(pred)}"
               f" GROUP BY {', '.join(keys)} HAVING {having}")
        return GenQuery(sql, params or None, f"FROM t{_where(pred)}", tuple(keys),
                        tuple(range(len(keys))))
    if kind == "group_topk":
        key = r.choice(["t.g", "t.s", "t.d"])
        agg = r.choice(AGGS)
        direction = r.choice(["DESC", "ASC"])
        tiebreak = r.random() < 0.5
        order = f"m {direction}" + (f", {key}" if tiebreak else "")
        k = r.randint(1, 5)
        having = f" HAVING {_having(r, params)}" if r.random() < 0.3 else ""
        base = (f"SELECT {key}, {agg} AS m FROM t{_where(pred)} GROUP BY {key}{having}"
                f" ORDER BY {order}")
        return GenQuery(f"{base} LIMIT {k}", params or None, f"FROM t{_where(pred)}", (key,),
                        (0,), f"{base} FETCH FIRST {k} ROWS WITH TIES",
                        (1, 0) if tiebreak else (1,), tiebreak)
    if kind == "rows_topk":
        col = r.choice(["g", "n", "s", "d", "ts", "v"])
        direction = r.choice(["", " DESC", " NULLS FIRST", " DESC NULLS LAST"])
        tiebreak = r.random() < 0.5
        order = f"t.{col}{direction}" + (", t.id" if tiebreak else "")
        k = r.randint(1, 8)
        if r.random() < 0.3:
            params.append(k)
            limit = f"${len(params)}"
        else:
            limit = str(k)
        base = f"SELECT t.id, t.{col}, t.v FROM t{_where(pred)} ORDER BY {order}"
        return GenQuery(f"{base} LIMIT {limit}", params or None, f"FROM t{_where(pred)}",
                        ("t.id",), (0,), f"{base} FETCH FIRST {k} ROWS WITH TIES",
                        (1, 0) if tiebreak else (1,), tiebreak)
    if kind == "distinct":
        col = r.choice(["g", "s", "d", "n"])
        if r.random() < 0.5:
            k = r.randint(1, 5)
            base = f"SELECT DISTINCT t.{col} FROM t{_where(pred)} ORDER BY t.{col}"
            return GenQuery(f"{base} LIMIT {k}", None, f"FROM t{_where(pred)}", (f"t.{col}",),
                            (0,), f"{base} FETCH FIRST {k} ROWS WITH TIES", (0,), True)
        return GenQuery(f"SELECT DISTINCT t.{col} FROM t{_where(pred)}", None,
                        f"FROM t{_where(pred)}", (f"t.{col}",), (0,))
    if kind in ("join", "join_topk"):
        dpred = r.choice([None, "dim.cat = 'a'", "dim.w > 20", "dim.cat IN ('a', 'b')"])
        comma = r.random() < 0.5
        if comma:
            from_ = f"FROM t, dim{_where('t.g = dim.k', pred, dpred)}"
        else:
            from_ = f"FROM t JOIN dim ON t.g = dim.k{_where(pred, dpred)}"
        lineage = f"FROM t, dim{_where('t.g = dim.k', pred, dpred)}"
        key = r.choice(["t.g", "dim.k"])
        agg = r.choice(["count(*)", "sum(dim.w)", "sum(t.v)", "max(dim.cat)"])
        if kind == "join":
            sql = f"SELECT {key}, {agg} AS m {from_} GROUP BY {key} HAVING {_having(r, params)}"
            return GenQuery(sql, params or None, lineage, (key,), (0,))
        k = r.randint(1, 4)
        base = f"SELECT {key}, {agg} AS m {from_} GROUP BY {key} ORDER BY m DESC, {key}"
        return GenQuery(f"{base} LIMIT {k}", None, lineage, (key,), (0,),
                        f"{base} FETCH FIRST {k} ROWS WITH TIES", (1, 0), True)
    if kind == "join_rows":
        k = r.randint(1, 6)
        col = r.choice(["t.v", "t.s", "dim.w"])
        base = (f"SELECT t.id, dim.id AS did, {col} FROM t JOIN dim ON t.g = dim.k"
                f"{_where(pred)} ORDER BY {col} DESC, t.id, dim.id")
        lineage = f"FROM t, dim{_where('t.g = dim.k', pred)}"
        return GenQuery(f"{base} LIMIT {k}", None, lineage, ("t.id", "dim.id"), (0, 1),
                        f"{base} FETCH FIRST {k} ROWS WITH TIES", (2, 0, 1), True)
    if kind == "join_unqualified":
        having = r.choice(["count(*) > 1", "sum(w) > 30", "NOT (count(*) < 3)",
                           "(count(*) > 4 OR max(cat) = 'a')"])
        sql = f"SELECT g, count(*) AS c FROM t, dim WHERE g = k GROUP BY g HAVING {having}"
        return GenQuery(sql, None, "FROM t, dim WHERE t.g = dim.k", ("t.g",), (0,))
    if kind == "subquery_join":
        sql = (f"SELECT q.key, sum(dim.w) AS m FROM (SELECT t.g AS key FROM t{_where(pred)}) q"
               f" JOIN dim ON q.key = dim.k GROUP BY q.key ORDER BY m DESC, q.key LIMIT 3")
        ties = sql.replace("LIMIT 3", "FETCH FIRST 3 ROWS WITH TIES")
        return GenQuery(sql, None, f"FROM t, dim{_where('t.g = dim.k', pred)}", ("t.g",), (0,),
                        ties, (1, 0), True)
    # subquery in FROM
    inner_col = r.choice(["g", "s", "d"])
    having = r.choice(["count(*) > 1", "sum(q.val) > 10", "count(*) >= $1", "max(q.val) < 50"])
    if "$1" in having:
        params.append(r.randint(1, 3))
    sql = (f"SELECT q.key, count(*) AS c, sum(q.val) AS m FROM (SELECT t.{inner_col} AS key,"
           f" t.v AS val FROM t{_where(pred)}) q GROUP BY q.key HAVING {having}")
    return GenQuery(sql, params or None, f"FROM t{_where(pred)}", (f"t.{inner_col}",), (0,))


def compare_results(q: GenQuery, original: list[tuple[Any, ...]],
                    instrumented: list[tuple[Any, ...]]) -> None:
    """Asserts the instrumented result equals the original: as multisets, and for top-k in
    order keys (rows tied at the last position may legitimately differ unless the order is
    fully determined)."""
    if not q.order_positions or q.determined:
        assert Counter(original) == Counter(instrumented), (q.sql, original, instrumented)
        if q.order_positions:
            assert original == instrumented, (q.sql, original, instrumented)
        return
    def keys(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        return [tuple(row[i] for i in q.order_positions) for row in rows]
    assert keys(original) == keys(instrumented), (q.sql, original, instrumented)
    if original:
        last = keys(original)[-1]
        a = Counter(r for r, k in zip(original, keys(original), strict=True) if k != last)
        b = Counter(r for r, k in zip(instrumented, keys(instrumented), strict=True)
                    if k != last)
        assert a == b, (q.sql, original, instrumented)
