"""Data generation, inside PostgreSQL: the IMP paper's synthetic tables and a TPC-H subset.

Synthetic data (IMP paper §8): table ``r`` with key ``id``, group attribute ``a`` uniform in
``1..G`` and nine further int/float columns linear in ``a`` plus Gaussian noise; a join partner
``s`` with one row per group value (``s.x = r.a``). Values are pseudo-random functions of the row
id and a seed (``hashint8extended`` + Box-Muller), computed by SQL functions installed in the
database, so a given (seed, id) gives the same row in the initial load and in every later insert
of the workload — every system under test sees exactly the same data.

``r`` is loaded ordered by ``a`` (physically clustered on the sketch attribute, as for data
skipping in the paper) with a B-tree index on ``a``.

TPC-H (lineitem, orders, customer, nation) is generated offline by ``tpchgen-cli`` (CSV, cached
under ``bench/data/``) and loaded with COPY.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

log = logging.getLogger(__name__)

#: 2**47: uniform values take the low 47 bits of a 64-bit hash
_U_SCALE = 140737488355328


@dataclass(frozen=True, slots=True)
class NoisyColumn:
    """A column ``round(slope * a + sigma * N(0, 1))`` (int) or the same unrounded (float8)."""

    name: str
    type: str  # "int" | "float8"
    slope: float
    sigma: float


#: r's columns after (id, a). b, c, d drive the query templates; the rest widen the rows like the
#: paper's "at least 11 attributes".
R_COLUMNS: tuple[NoisyColumn, ...] = (
    NoisyColumn("b", "int", 10.0, 50.0),
    NoisyColumn("c", "int", 3.0, 20.0),
    NoisyColumn("d", "int", 100.0, 1000.0),
    NoisyColumn("e", "int", 1.0, 5.0),
    NoisyColumn("f", "float8", 0.5, 2.0),
    NoisyColumn("g", "float8", 2.5, 10.0),
    NoisyColumn("h", "int", 7.0, 100.0),
    NoisyColumn("i", "int", -4.0, 30.0),
    NoisyColumn("j", "float8", 1.0, 0.5),
)

S_REGIONS = 10

_FUNCTIONS = """
CREATE OR REPLACE FUNCTION bench_u(x bigint, salt bigint) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ((hashint8extended(x, salt) & 140737488355327)::float8 + 0.5) / 140737488355328.0;

CREATE OR REPLACE FUNCTION bench_n(x bigint, salt bigint) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN sqrt(-2.0 * ln(bench_u(x, salt))) * cos(2.0 * pi() * bench_u(x, salt + 7919));

CREATE OR REPLACE FUNCTION bench_a(x bigint, salt bigint, groups int) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 1 + ((hashint8extended(x, salt) & 2147483647) % groups)::int;
"""


def install_functions(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    conn.execute(_FUNCTIONS)


def r_column_names() -> list[str]:
    return ["id", "a", *[c.name for c in R_COLUMNS]]


def noisy_exprs(id_col: sql.Composable, a_col: sql.Composable, salt: int) -> list[sql.Composed]:
    """Select-list expressions for R_COLUMNS given SQL expressions for the id and for ``a``."""
    out: list[sql.Composed] = []
    for k, col in enumerate(R_COLUMNS):
        noise = sql.SQL("bench_n({} * 16 + {}, {})").format(
            id_col, sql.Literal(k), sql.Literal(salt))
        lin = sql.SQL("({} * {} + {} * {})").format(
            sql.Literal(col.slope), a_col, sql.Literal(col.sigma), noise)
        if col.type == "int":
            out.append(sql.SQL("round({})::int").format(lin))
        else:
            out.append(sql.SQL("{}::float8").format(lin))
    return out


def r_rows_query(lo: int, hi: int, seed: int, groups: int) -> sql.Composed:
    """SELECT producing r's rows with ids lo..hi (inclusive), ordered by a."""
    id_col, a_col = sql.Identifier("id"), sql.Identifier("a")
    cols = sql.SQL(", ").join([id_col, a_col, *noisy_exprs(id_col, a_col, seed)])
    return sql.SQL(
        "SELECT {cols} FROM (SELECT g::bigint AS id, bench_a(g, {seed}, {groups}) AS a "
        "FROM generate_series({lo}::bigint, {hi}::bigint) AS g) AS t ORDER BY a, id"
    ).format(cols=cols, seed=sql.Literal(seed), groups=sql.Literal(groups),
             lo=sql.Literal(lo), hi=sql.Literal(hi))


def create_synthetic(conn: psycopg.Connection[tuple[object, ...]], rows: int, groups: int,
                     seed: int) -> None:
    """Creates and fills ``r`` (rows) and ``s`` (groups rows), indexes them and ANALYZEs."""
    install_functions(conn)
    coldefs: list[sql.Composable] = [sql.SQL("id bigint PRIMARY KEY"), sql.SQL("a int NOT NULL")]
    coldefs += [sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.type))
                for c in R_COLUMNS]
    conn.execute("DROP TABLE IF EXISTS r, s")
    conn.execute(sql.SQL("CREATE TABLE r ({})").format(sql.SQL(", ").join(coldefs)))
    names = sql.SQL(", ").join(sql.Identifier(n) for n in r_column_names())
    conn.execute(sql.SQL("INSERT INTO r ({}) {}").format(
        names, r_rows_query(1, rows, seed, groups)))
    conn.execute("CREATE INDEX r_a_idx ON r (a)")
    conn.execute(
        sql.SQL(
            "CREATE TABLE s (x int PRIMARY KEY, region int NOT NULL, w int NOT NULL, label text)"))
    conn.execute(sql.SQL(
        "INSERT INTO s SELECT x, (hashint8extended(x, {seed}) & 65535)::int % {regions}, "
        "round(5 * x + 10 * bench_n(x, {seed2}))::int, 'grp-' || x "
        "FROM generate_series(1, {groups}) AS x"
    ).format(seed=sql.Literal(seed + 1), regions=sql.Literal(S_REGIONS),
             seed2=sql.Literal(seed + 2), groups=sql.Literal(groups)))
    conn.execute("ANALYZE r")
    conn.execute("ANALYZE s")
    log.info("synthetic data: r %d rows, %d groups; s %d rows", rows, groups, groups)


# ---------------------------------------------------------------------------------------- TPC-H

TPCH_TABLES: dict[str, str] = {
    "nation": """CREATE TABLE nation (n_nationkey int PRIMARY KEY, n_name char(25) NOT NULL,
        n_regionkey int NOT NULL, n_comment varchar(152))""",
    "customer": """CREATE TABLE customer (c_custkey bigint PRIMARY KEY,
        c_name varchar(25) NOT NULL, c_address varchar(40) NOT NULL, c_nationkey int NOT NULL,
        c_phone char(15) NOT NULL, c_acctbal numeric(15,2) NOT NULL,
        c_mktsegment char(10) NOT NULL, c_comment varchar(117) NOT NULL)""",
    "orders": """CREATE TABLE orders (o_orderkey bigint PRIMARY KEY, o_custkey bigint NOT NULL,
        o_orderstatus char(1) NOT NULL, o_totalprice numeric(15,2) NOT NULL,
        o_orderdate date NOT NULL, o_orderpriority char(15) NOT NULL, o_clerk char(15) NOT NULL,
        o_shippriority int NOT NULL, o_comment varchar(79) NOT NULL)""",
    "lineitem": """CREATE TABLE lineitem (l_orderkey bigint NOT NULL, l_partkey bigint NOT NULL,
        l_suppkey bigint NOT NULL, l_linenumber int NOT NULL, l_quantity numeric(15,2) NOT NULL,
        l_extendedprice numeric(15,2) NOT NULL, l_discount numeric(15,2) NOT NULL,
        l_tax numeric(15,2) NOT NULL, l_returnflag char(1) NOT NULL,
        l_linestatus char(1) NOT NULL, l_shipdate date NOT NULL, l_commitdate date NOT NULL,
        l_receiptdate date NOT NULL, l_shipinstruct char(25) NOT NULL,
        l_shipmode char(10) NOT NULL, l_comment varchar(44) NOT NULL,
        PRIMARY KEY (l_orderkey, l_linenumber))""",
}
TPCH_INDEXES = (
    "CREATE INDEX orders_custkey_idx ON orders (o_custkey)",
    "CREATE INDEX customer_nation_idx ON customer (c_nationkey)",
)


def tpchgen_binary() -> str:
    """The ``tpchgen-cli`` next to this interpreter (the venv), else on PATH."""
    here = Path(sys.executable).parent / "tpchgen-cli"
    if here.exists():
        return str(here)
    found = shutil.which("tpchgen-cli")
    if found is None:
        raise RuntimeError("tpchgen-cli not found: pip install tpchgen-cli (extra 'bench')")
    return found


def generate_tpch_csv(sf: float, data_dir: Path) -> Path:
    """CSV files for the TPC-H subset at scale factor ``sf``, cached in ``data_dir/tpch-sf<sf>``."""
    out = data_dir / f"tpch-sf{sf:g}"
    if all((out / f"{t}.csv").exists() for t in TPCH_TABLES) and (out / ".complete").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    cmd = [tpchgen_binary(), "csv", "-s", f"{sf:g}", "-o", str(out), "--overwrite",
           "--no-progress", "-q"]
    for t in TPCH_TABLES:
        cmd += ["-T", t]
    log.info("generating TPC-H SF %g: %s", sf, " ".join(cmd))
    subprocess.run(cmd, check=True, capture_output=True)
    (out / ".complete").write_text("ok\n")
    return out


def load_tpch(conn: psycopg.Connection[tuple[object, ...]], sf: float, data_dir: Path) -> None:
    """Creates the TPC-H subset tables and COPYs the generated CSV into them."""
    src = generate_tpch_csv(sf, data_dir)
    for table in reversed(list(TPCH_TABLES)):
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
    for table, ddl in TPCH_TABLES.items():
        conn.execute(ddl)  # constant DDL, no values
        copy_sql = sql.SQL("COPY {} FROM STDIN WITH (FORMAT csv, HEADER true)").format(
            sql.Identifier(table))
        with conn.cursor() as cur, cur.copy(copy_sql) as copy, open(src / f"{table}.csv",
                                                                    "rb") as fh:
            while chunk := fh.read(1 << 20):
                copy.write(chunk)
    for stmt in TPCH_INDEXES:
        conn.execute(stmt)
    for table in TPCH_TABLES:
        conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))
    counts = {t: conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(t)))
              .fetchone() for t in TPCH_TABLES}
    log.info("TPC-H SF %g loaded: %s", sf, {t: c[0] if c else 0 for t, c in counts.items()})


def max_ids(conn: psycopg.Connection[tuple[object, ...]]) -> dict[str, int]:
    """Largest keys of the tables the workload inserts into (ids for inserts start above)."""
    out: dict[str, int] = {}
    row = conn.execute("SELECT coalesce(max(id), 0) FROM r").fetchone()
    out["r"] = int(row[0]) if row else 0  # type: ignore[call-overload]
    has_tpch = conn.execute("SELECT to_regclass('orders') IS NOT NULL").fetchone()
    if has_tpch and has_tpch[0]:
        row = conn.execute("SELECT coalesce(max(o_orderkey), 0) FROM orders").fetchone()
        out["orders"] = int(row[0]) if row else 0  # type: ignore[call-overload]
    return out
