"""A sketchable query whose batch is larger than one read of the proxy, direct and through
the proxy of one tree, side by side in one run.

``python split_batch.py <side> literals|pieces|params`` from a checkout's root
(``PYTHONPATH=<tree>``): starts a throwaway PostgreSQL 15 and the proxy of that tree and
sends ``SELECT … WHERE g [NOT] IN (…) GROUP BY g HAVING …``, alternating direct and proxied:
``literals``, psycopg with the list as 2,000 literals (a 13 kB text: libpq 16 and later send
a message of 8 kB or more on its own); ``pieces``, the same text from a client that sends
the Parse and, 1 ms later, the rest of the batch (:class:`Pieces`); ``params``, psycopg with
the list as 20,000 parameters (Parse and Bind 0.37 MB: more than the 250 kB the proxy's
event loop reads at once). Prints the medians, their ratio, how many proxied runs were
wrapped (``IMP SHOW STATS``) and whether every answer matched.
"""

from __future__ import annotations

import socket
import statistics
import sys
import time
from typing import Any

import psycopg

from bench.proxy_process import launch_proxy
from imp_proxy.embedded import given_or_throwaway
from imp_proxy.protocol import codec
from imp_proxy.protocol.framing import MessageReader
from imp_proxy.protocol.messages import Bind

ROWS, GROUPS, N, LITERALS, RUNS = 1_000_000, 2000, 20_000, 2000, 15


def stats(c: psycopg.Connection[Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in c.execute("IMP SHOW STATS").fetchall()}


class Pieces:
    """A v3 client that sends a query's Parse and, ``GAP`` s later, its Bind, Describe,
    Execute and Sync (libpq 16 and later send a Parse of 8 kB or more on its own; over a
    network the rest may come a moment later); returns the DataRows' values."""

    GAP = 0.001

    def __init__(self, dsn: str) -> None:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
        self.sock = socket.create_connection((str(info["host"]), int(str(info["port"]))))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = MessageReader()
        self.sock.sendall(codec.encode_startup({"user": str(info["user"]),
                                                "database": str(info["dbname"])}))
        self._until_ready()

    def _until_ready(self) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        while not out or out[-1][0] != ord("Z"):
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("closed")
            out += self.reader.feed(data)
        return out

    def execute(self, sql: str, params: list[int]) -> list[tuple[Any, ...]]:
        assert not params
        self.sock.sendall(codec.encode_parse("", sql))
        time.sleep(self.GAP)
        self.sock.sendall(codec.encode_bind(Bind("", "", (), (), ())) + codec.encode_describe(
            "P", "") + codec.encode_execute("") + codec.encode_sync())
        rows = []
        for typ, msg in self._until_ready():
            if typ == ord("E"):
                raise RuntimeError(codec.decode_error_fields(msg).message)
            if typ == ord("D"):
                vals = codec.decode_data_row(msg).values
                rows.append(tuple(None if v is None else int(v.decode()) for v in vals))
        return rows

    def close(self) -> None:
        self.sock.close()


def main() -> None:
    side = sys.argv[1] if len(sys.argv) > 1 else "tree"
    shape = sys.argv[2] if len(sys.argv) > 2 else "literals"
    if shape in ("literals", "pieces"):   # the Parse alone is 11 kB: libpq ≥ 16 sends it on its own
        values = ", ".join(str(-i) for i in range(1, LITERALS + 1))
        q = (f"SELECT g, sum(v) FROM sb WHERE g NOT IN ({values}) GROUP BY g"
             " HAVING sum(v) > 20000 ORDER BY g")
        params: list[int] = []
    else:   # Parse and Bind together about 0.37 MB: more than one read of the proxy
        marks = ",".join(["%s"] * N)
        q = (f"SELECT g, sum(v) FROM sb WHERE g IN ({marks}) GROUP BY g"
             " HAVING sum(v) > 20000 ORDER BY g")
        params = [i % (GROUPS // 2) for i in range(N)]   # half the groups, each many times
    with given_or_throwaway(None) as dsn:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("CREATE TABLE sb (id int PRIMARY KEY, g int NOT NULL, v int NOT NULL)")
            c.execute(f"INSERT INTO sb SELECT i, i % {GROUPS}, CASE WHEN i % {GROUPS} % 100 = 0"
                      f" THEN 100 ELSE i % 53 END FROM generate_series(1, {ROWS}) i"
                      f" ORDER BY i % {GROUPS}")
            c.execute("CREATE INDEX ON sb (g)")
            c.execute("VACUUM ANALYZE sb")
        proxy = launch_proxy(dsn, log_level="WARNING")
        try:
            via = psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=proxy.port)
            with psycopg.connect(via, autocommit=True) as p, \
                    psycopg.connect(dsn, autocommit=True) as d:
                run_p: Any = p
                run_d: Any = d
                if shape == "pieces":
                    run_p, run_d = Pieces(via), Pieces(dsn)
                want = _rows(run_d, q, params)
                for _ in range(3):   # the capture, then answers through the sketch
                    assert _rows(run_p, q, params) == want
                first = stats(p)
                direct: list[float] = []
                proxied: list[float] = []
                same = 0
                for _ in range(RUNS):
                    for conn, out in ((run_d, direct), (run_p, proxied)):
                        t0 = time.perf_counter()
                        rows = _rows(conn, q, params)
                        out.append((time.perf_counter() - t0) * 1e3)
                        same += rows == want
                if isinstance(run_p, Pieces):
                    run_p.close()
                    run_d.close()
                last = stats(p)
                wrapped = int(last["proxy.wrapped"]) - int(first["proxy.wrapped"])
                moved = {k: int(v) - int(first.get(k, 0)) for k, v in last.items()
                         if k.startswith("proxy.") and v.isdigit()
                         and int(v) != int(first.get(k, 0))}
            dm, pm = statistics.median(direct), statistics.median(proxied)
            print(f"{side} {shape}: {len(q)} characters, {len(want)} rows; "
                  f"direct {dm:.1f} ms, proxy {pm:.1f} ms, proxy/direct speed {dm / pm:.2f}x; "
                  f"wrapped {wrapped}/{RUNS}; "
                  f"answers identical {same}/{2 * RUNS}; {moved}")
        finally:
            proxy.stop()


def _rows(conn: Any, q: str, params: list[int]) -> list[tuple[Any, ...]]:
    if isinstance(conn, Pieces):
        return conn.execute(q, params)
    return [tuple(r) for r in conn.execute(q, params).fetchall()]


if __name__ == "__main__":
    main()
