"""The proxy's resident memory after 800 distinct sketchable queries with 256 KiB comments.

Run from a checkout's root (``PYTHONPATH=<tree>``): starts a throwaway PostgreSQL 15 and the
proxy of that tree, sends the queries through it with psycopg, and prints the proxy's RSS
(``/proc/<pid>/status`` VmRSS) before and after, and the answers' agreement with PostgreSQL.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import psycopg

from bench.proxy_process import launch_proxy
from imp_proxy.embedded import given_or_throwaway

QUERIES, PAD = 800, 256 << 10


def rss_mib(pid: int) -> float:
    m = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    assert m is not None
    return int(m.group(1)) / 1024


def main() -> None:
    with given_or_throwaway(None) as dsn:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("DROP TABLE IF EXISTS cb")
            c.execute("CREATE TABLE cb (id int PRIMARY KEY, g int, v int)")
            c.execute("INSERT INTO cb SELECT i, i % 50, i % 97 FROM generate_series(1, 20000) i")
            c.execute("ANALYZE cb")
        proxy = launch_proxy(dsn, log_level="WARNING")
        try:
            via = psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=proxy.port)
            with psycopg.connect(via, autocommit=True) as p, \
                    psycopg.connect(dsn, autocommit=True) as d:
                warm = "SELECT g, sum(v) FROM cb GROUP BY g HAVING sum(v) > 19500 ORDER BY g"
                for _ in range(3):
                    p.execute(warm).fetchall()
                before = rss_mib(proxy.pid)
                same = 0
                for i in range(QUERIES):
                    q = (f"SELECT g, sum(v) FROM cb /* {i} {'x' * PAD} */"
                         " GROUP BY g HAVING sum(v) > 19500 ORDER BY g")
                    same += p.execute(q).fetchall() == d.execute(q).fetchall()
                after = rss_mib(proxy.pid)
            print(f"{sys.argv[1] if len(sys.argv) > 1 else 'tree'}: RSS {before:.0f} MiB before,"
                  f" {after:.0f} MiB after {QUERIES} queries of {PAD >> 10} KiB"
                  f" (+{after - before:.0f} MiB); answers identical {same}/{QUERIES}")
        finally:
            proxy.stop()


if __name__ == "__main__":
    main()
