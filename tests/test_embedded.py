from __future__ import annotations

import psycopg


def test_throwaway_cluster_answers(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    row = conn.execute("SHOW server_version_num").fetchone()
    assert row is not None and int(str(row[0])) // 10000 == 15
