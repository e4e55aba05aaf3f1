"""``imp-proxy demo``: the product in one minute, on a throwaway PostgreSQL (or a given DSN).

It loads the IMP paper's synthetic table, then sends a HAVING query and a top-k query both
directly to PostgreSQL and through the proxy, checks that the answers are identical, and
prints the latencies side by side; then it changes the table directly on PostgreSQL (not
through the proxy) and shows that the proxy's answers stay exact while its sketches are
maintained. Everything goes over the wire with psycopg, like an application.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from rich.console import Console
from rich.table import Table

from .embedded import given_or_throwaway

log = logging.getLogger(__name__)

TABLE = "imp_demo_sales"
HAVING_SQL = (f"SELECT a, count(*) AS n, sum(b) AS total FROM {TABLE} "
              "GROUP BY a HAVING avg(b) > %(threshold)s ORDER BY a")
TOPK_SQL = (f"SELECT a, sum(c) AS revenue FROM {TABLE} "
            "GROUP BY a ORDER BY sum(c) DESC, a LIMIT 10")


@dataclass(frozen=True, slots=True)
class Timing:
    label: str
    direct_ms: float
    proxy_ms: float
    identical: bool

    @property
    def speedup(self) -> float:
        return self.direct_ms / self.proxy_ms if self.proxy_ms else float("inf")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--upstream", metavar="DSN", default=None,
                        help="use this PostgreSQL instead of a throwaway local one "
                             "(the demo creates and drops table imp_demo_sales there)")
    parser.add_argument("--rows", type=int, default=1_000_000,
                        help="rows of the synthetic table (default 1000000)")
    parser.add_argument("--groups", type=int, default=10_000,
                        help="distinct group ids a (default 10000)")
    parser.add_argument("--repeat", type=int, default=5,
                        help="timed executions per query and path; the median is shown")
    parser.add_argument("--keep-running", action="store_true",
                        help="keep the demo proxy running until Ctrl-C (connect with psql)")


def _load(conn: psycopg.Connection[Any], rows: int, groups: int) -> None:
    """The IMP paper's synthetic table: a = group id, b and c linear in a plus noise."""
    table = sql.Identifier(TABLE)
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
    conn.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, a int NOT NULL, b int, c int)")
                 .format(table))
    conn.execute(sql.SQL(
        "INSERT INTO {} SELECT i, g, g * 3 + (random() * 20)::int,"
        " g * 7 + (random() * 50)::int"
        " FROM (SELECT i, 1 + floor(random() * %s)::int AS g"
        "       FROM generate_series(1, %s) AS i) AS s").format(table), (groups, rows))
    conn.execute(sql.SQL("CREATE INDEX ON {} (a)").format(table))
    conn.execute(sql.SQL("ANALYZE {}").format(table))


def _median_ms(run: Callable[[], list[tuple[Any, ...]]], repeat: int
               ) -> tuple[float, list[tuple[Any, ...]]]:
    times, rows = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        rows = run()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), rows


def _compare(label: str, query: str, params: dict[str, Any], direct: psycopg.Connection[Any],
             proxied: psycopg.Connection[Any], repeat: int) -> Timing:
    proxied.execute(query, params).fetchall()  # first sight: the proxy captures the sketch
    d_ms, d_rows = _median_ms(lambda: direct.execute(query, params).fetchall(), repeat)
    p_ms, p_rows = _median_ms(lambda: proxied.execute(query, params).fetchall(), repeat)
    return Timing(label, d_ms, p_ms, d_rows == p_rows)


def _timings_table(title: str, timings: list[Timing]) -> Table:
    table = Table(title=title)
    for col in ("query", "PostgreSQL (ms)", "through IMP proxy (ms)", "speed-up", "identical"):
        table.add_column(col, justify="right" if "ms" in col or col == "speed-up" else "left")
    for t in timings:
        table.add_row(t.label, f"{t.direct_ms:.1f}", f"{t.proxy_ms:.1f}", f"{t.speedup:.1f}x",
                      "yes" if t.identical else "[red]NO[/red]")
    return table


def _rows_table(title: str, cur: psycopg.Cursor[Any], columns: tuple[str, ...] | None = None
                ) -> Table:
    names = [d.name for d in cur.description or ()]
    keep = [i for i, n in enumerate(names) if columns is None or n in columns]
    table = Table(title=title)
    for i in keep:
        table.add_column(names[i])
    for row in cur.fetchall():
        table.add_row(*(str(row[i]) if len(str(row[i])) < 90 else str(row[i])[:87] + "..."
                        for i in keep))
    return table


def _change_data(direct: psycopg.Connection[Any], groups: int) -> None:
    """Inserts, updates and deletes by another client, directly on PostgreSQL."""
    t = sql.Identifier(TABLE)
    direct.execute(sql.SQL(
        "INSERT INTO {} SELECT 100000000 + i, 1 + (i * 7919) %% %s, 50000, 90000"
        " FROM generate_series(1, 200) AS i").format(t), (groups,))
    direct.execute(sql.SQL("UPDATE {} SET c = c + 5000 WHERE id %% %s = 0").format(t), (997,))
    direct.execute(sql.SQL("DELETE FROM {} WHERE a = %s").format(t), (groups,))


def run(args: argparse.Namespace) -> int:
    from .cli import load_hook
    from .config import ProxyConfig
    from .server import running_proxy

    console = Console(width=None if Console().is_terminal else 120)
    threshold = {"threshold": int(args.groups * 3 * 0.97)}  # the top ~3 % of the groups
    with given_or_throwaway(args.upstream) as upstream:
        cfg = ProxyConfig(listen_port=0, upstream=upstream)
        with running_proxy(cfg, load_hook(None)) as proxy:
            proxy_dsn = psycopg.conninfo.make_conninfo(upstream, host="127.0.0.1",
                                                      port=proxy.port)
            console.print(f"PostgreSQL: {upstream}\nIMP proxy:  {proxy_dsn}")
            with psycopg.connect(upstream, autocommit=True) as direct, \
                    psycopg.connect(proxy_dsn, autocommit=True) as proxied:
                with console.status(f"loading {args.rows:,} rows into {TABLE} ..."):
                    _load(direct, args.rows, args.groups)
                timings = [
                    _compare("HAVING avg(b) > t", HAVING_SQL, threshold, direct, proxied,
                             args.repeat),
                    _compare("top-10 by sum(c)", TOPK_SQL, {}, direct, proxied, args.repeat),
                ]
                console.print(_timings_table("Same queries, same answers", timings))
                explain = proxied.execute("IMP EXPLAIN " + TOPK_SQL)
                console.print(_rows_table("IMP EXPLAIN <top-k query>", explain))
                _change_data(direct, args.groups)
                after = [
                    _compare("HAVING after writes", HAVING_SQL, threshold, direct, proxied,
                             args.repeat),
                    _compare("top-10 after writes", TOPK_SQL, {}, direct, proxied,
                             args.repeat),
                ]
                console.print(_timings_table(
                    "After 200 inserts, updates and a group delete sent directly to PostgreSQL",
                    after))
                console.print(_rows_table("IMP SHOW SKETCHES",
                                          proxied.execute("IMP SHOW SKETCHES"),
                                          ("sketch_id", "tables", "attributes", "fragments",
                                           "selected_fragments", "strategy", "captures",
                                           "maintenances", "uses")))
                ok = all(t.identical for t in timings + after)
                direct.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(TABLE)))
            if args.keep_running:
                console.print(f"psql '{proxy_dsn}'   (Ctrl-C to stop)")
                with contextlib.suppress(KeyboardInterrupt):
                    signal.pause()
    console.print("all answers identical" if ok else "[red]MISMATCH between proxy and "
                  "PostgreSQL[/red]")
    return 0 if ok else 1
