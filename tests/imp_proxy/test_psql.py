"""The psql binary through the proxy: the same script, same output as directly."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from .conftest import ProxyProcess, via_proxy

SCRIPT = r"""
CREATE TABLE pt (id int PRIMARY KEY, name text, v numeric);
INSERT INTO pt SELECT g, 'n' || g, round(g / 3.0, 4) FROM generate_series(1, 50) g;
SELECT * FROM pt WHERE id < 5 ORDER BY id;
\d pt
\copy pt TO 'out.csv' CSV
CREATE TABLE pt2 (LIKE pt);
\copy pt2 FROM 'out.csv' CSV
SELECT count(*), sum(v) FROM pt2;
SELECT 1/0;
SELECT 'after error' AS msg;
BEGIN;
SELECT * FROM missing_table;
SELECT 1;
ROLLBACK;
DO $$ BEGIN RAISE NOTICE 'notice from %', 'plpgsql'; END $$;
SELECT 1 AS a; SELECT 2 AS b;
\echo done
"""


def run_psql(dsn: str, workdir: Path) -> tuple[int, str, str, bytes]:
    workdir.mkdir()
    (workdir / "script.sql").write_text(SCRIPT)
    res = subprocess.run(["psql", "-X", "-v", "ON_ERROR_STOP=0", "-d", dsn, "-f", "script.sql"],
                         cwd=workdir, capture_output=True, text=True, timeout=60)
    return res.returncode, res.stdout, res.stderr, (workdir / "out.csv").read_bytes()


def test_psql_script_same_as_direct(fresh_db: Callable[[], str], proxy: ProxyProcess,
                                    tmp_path: Path) -> None:
    direct = run_psql(fresh_db(), tmp_path / "direct")
    proxied = run_psql(via_proxy(fresh_db(), proxy.port), tmp_path / "proxied")
    assert proxied == direct
    rc, out, err, csv = proxied
    assert rc == 0
    assert 'Table "public.pt"' in out and "after error" in out and "done" in out
    assert "division by zero" in err and 'relation "missing_table" does not exist' in err
    assert "current transaction is aborted" in err
    assert "NOTICE:  notice from plpgsql" in err
    assert csv.count(b"\n") == 50
