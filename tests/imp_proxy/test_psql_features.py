"""Client-side features of the psql binary through a sketch-enabled proxy (a helper's search
in session 28, which found nothing wrong; kept as their regression suite), each script
compared with the same script run directly against PostgreSQL on the same database (stdout,
stderr, exit status; only the port/host in \\conninfo-like output normalised). The
interactive cases of that search (a pseudo-terminal: ON_ERROR_ROLLBACK=interactive,
\\password, \\watch and cancel by Ctrl-C) were left out: their keystrokes are timed.

The queries are sketchable (GROUP BY … HAVING, ORDER BY agg LIMIT k over 6,000 ANALYZEd
rows) and warmed up so that the proxy really answers them with a sketch (checked with
IMP EXPLAIN)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from .conftest import ProxyProcess, StartProxy, via_proxy

pytest.importorskip("sketches.manager")

HAVING = "SELECT g, count(*) AS n, max(v) AS m FROM hp GROUP BY g HAVING max(v) >= 990 ORDER BY g"
TOPK = "SELECT g, sum(v) AS s FROM hp GROUP BY g ORDER BY s DESC, g LIMIT 3"


@pytest.fixture(scope="module")
def data(db_dsn: str) -> str:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE hp (id int PRIMARY KEY, g int, v int, s text)"
                  " WITH (autovacuum_enabled = false)")
        c.execute("INSERT INTO hp SELECT i, i % 60, (i * 37) % 1000, 'x' || (i % 7) FROM"
                  " generate_series(1, 6000) i ORDER BY i % 60")
        c.execute("ANALYZE hp")
    return db_dsn


@pytest.fixture(scope="module")
def px(start_proxy: StartProxy, data: str) -> Iterator[tuple[ProxyProcess, str]]:
    p = start_proxy("--library-setting", "batch_interval=0.3", "--library-setting",
                    "state_interval=0.5", "--library-setting", "fragments=20", sketches=True)
    dsn = via_proxy(data, p.port)
    with psycopg.connect(dsn, autocommit=True) as c:
        for _ in range(3):
            for q in (HAVING, TOPK):
                c.execute(q).fetchall()
        for q in (HAVING, TOPK):
            assert explain(c, q)["decision"] == "use", explain(c, q)
    yield p, dsn


def explain(c: psycopg.Connection[Any], sql: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in c.execute("IMP EXPLAIN " + sql).fetchall()}


def psql(dsn: str, script: str, *args: str, cwd: Path, stdin: str | None = None,
         timeout: float = 60) -> tuple[int, str, str]:
    cwd.mkdir(parents=True, exist_ok=True)
    (cwd / "script.sql").write_text(script)
    cmd = ["psql", "-X", "-d", dsn, *args]
    if stdin is None:
        cmd += ["-f", "script.sql"]
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                         input=stdin, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8",
                                           "HOME": str(cwd), "PGAPPNAME": "psql"})
    (cwd / "stdout.txt").write_text(res.stdout)
    (cwd / "stderr.txt").write_text(res.stderr)
    return res.returncode, res.stdout, res.stderr


def norm(text: str, port: int) -> str:
    return text.replace(f'port "{port}"', 'port "PORT"')


def both(px: tuple[ProxyProcess, str], data: str, tmp_path: Path, script: str,
         *args: str, stdin: str | None = None, proxy_first: bool = True,
         ) -> tuple[tuple[int, str, str], tuple[int, str, str]]:
    """(proxied, direct) results of one script; the proxy runs first by default."""
    p, dsn = px
    direct_port = psycopg.conninfo.conninfo_to_dict(data).get("port")
    runs = [("proxied", dsn), ("direct", data)]
    if not proxy_first:
        runs.reverse()
    out: dict[str, tuple[int, str, str]] = {}
    for name, d in runs:
        rc, so, se = psql(d, script, *args, cwd=tmp_path / name, stdin=stdin)
        port = p.port if name == "proxied" else direct_port
        out[name] = (rc, norm(so, int(port or 0)), norm(se, int(port or 0)))
    return out["proxied"], out["direct"]


def same(px: tuple[ProxyProcess, str], data: str, tmp_path: Path, script: str,
         *args: str, stdin: str | None = None, proxy_first: bool = True) -> tuple[int, str, str]:
    proxied, direct = both(px, data, tmp_path, script, *args, stdin=stdin,
                           proxy_first=proxy_first)
    assert proxied == direct
    return proxied


def still_used(px: tuple[ProxyProcess, str]) -> None:
    with psycopg.connect(px[1], autocommit=True) as c:
        for q in (HAVING, TOPK):
            assert explain(c, q)["decision"] == "use"


# ---------------------------------------------------------------------------------------


def test_plain_sketched_queries(px: tuple[ProxyProcess, str], data: str,
                                tmp_path: Path) -> None:
    rc, out, _ = same(px, data, tmp_path, f"{HAVING};\n{TOPK};\n{HAVING};\n{TOPK};\n")
    assert rc == 0 and "(3 rows)" in out
    still_used(px)



def test_on_error_rollback_on(px: tuple[ProxyProcess, str], data: str, tmp_path: Path) -> None:
    script = f"""
{HAVING};
BEGIN;
{TOPK};
SELECT 1/0;
{HAVING};
SELECT * FROM no_such_table;
{TOPK};
COMMIT;
BEGIN ISOLATION LEVEL REPEATABLE READ;
{HAVING};
SELECT 1/0;
{TOPK};
ROLLBACK;
{TOPK};
"""
    rc, out, err = same(px, data, tmp_path, script, "-v", "ON_ERROR_ROLLBACK=on")
    assert "division by zero" in err and "aborted" not in err
    assert out.count("(3 rows)") == 4
    still_used(px)


def test_on_error_rollback_interactive_not_a_tty(px: tuple[ProxyProcess, str], data: str,
                                                 tmp_path: Path) -> None:
    """Script on stdin (not a terminal): `interactive` does not apply, the transaction is
    aborted (the terminal case: test_interactive_on_error_rollback)."""
    script = f"BEGIN;\n{HAVING};\nSELECT 1/0;\n{TOPK};\nCOMMIT;\n{TOPK};\n"
    rc, out, err = same(px, data, tmp_path, "", "-v", "ON_ERROR_ROLLBACK=interactive",
                        stdin=script)
    assert "current transaction is aborted" in err and "ROLLBACK" in out


def test_on_error_stop(px: tuple[ProxyProcess, str], data: str, tmp_path: Path) -> None:
    script = f"{HAVING};\n{TOPK};\nSELECT 1/0;\n{HAVING};\n"
    rc, out, err = same(px, data, tmp_path, script, "-v", "ON_ERROR_STOP=1")
    assert rc == 3 and out.count("rows)") == 2
    script = f"{HAVING};\nSELECT g, sum(v) FROM hp GROUP BY g HAVING sum(v) > 'abc';\n{TOPK};\n"
    rc, out, err = same(px, data, tmp_path / "2", script, "-v", "ON_ERROR_STOP=1")
    assert rc == 3 and "invalid input syntax" in err


def test_autocommit_off(px: tuple[ProxyProcess, str], data: str, tmp_path: Path) -> None:
    script = f"""
\\set AUTOCOMMIT off
{HAVING};
{TOPK};
\\echo :AUTOCOMMIT
SELECT 1/0;
{TOPK};
ROLLBACK;
{HAVING};
COMMIT;
SHOW transaction_isolation;
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ;
COMMIT;
{HAVING};
COMMIT;
"""
    rc, out, err = same(px, data, tmp_path, script)
    assert "current transaction is aborted" in err
    still_used(px)


def test_single_transaction_with_imp_statements(px: tuple[ProxyProcess, str], data: str,
                                                tmp_path: Path) -> None:
    """`psql -1`: BEGIN … COMMIT around the whole file; IMP statements' output goes to
    /dev/null so that the rest compares with the same script where they are SELECT 1."""
    body = f"""
{HAVING};
IMP EXPLAIN {TOPK} \\g /dev/null
{TOPK};
IMP SHOW SKETCHES \\g /dev/null
IMP SHOW STATS \\g /dev/null
{HAVING};
"""
    p, dsn = px
    got = psql(dsn, body, "-1", cwd=tmp_path / "p")
    want = psql(data, re.sub(r"IMP [^\\]*\\g", r"SELECT 1 \\g", body), "-1",
                cwd=tmp_path / "d")
    assert got == want
    # an error in -1 rolls everything back, IMP included
    bad = body + "SELECT 1/0;\n"
    got = psql(dsn, bad, "-1", "-v", "ON_ERROR_STOP=1", cwd=tmp_path / "p2")
    want = psql(data, re.sub(r"IMP [^\\]*\\g", r"SELECT 1 \\g", bad), "-1", "-v",
                "ON_ERROR_STOP=1", cwd=tmp_path / "d2")
    assert got == want
    still_used(px)


def test_gset_gexec_gx_gfile(px: tuple[ProxyProcess, str], data: str, tmp_path: Path) -> None:
    top1 = "SELECT g AS top_g, sum(v) AS top_s FROM hp GROUP BY g ORDER BY top_s DESC, g LIMIT 1"
    script = f"""
{top1} \\gset
{top1} \\gset
\\echo :top_g :top_s
{TOPK} \\gset pre_
{HAVING} \\gx
{TOPK} \\gx
SELECT format('SELECT %s AS g, %s AS m', g, max(v)) FROM hp GROUP BY g
  HAVING max(v) >= 990 ORDER BY g \\gexec
SELECT format('SELECT %s AS g, %s AS m', g, max(v)) FROM hp GROUP BY g
  HAVING max(v) >= 990 ORDER BY g \\gexec
{HAVING} \\g out1.txt
{TOPK} \\g (format=csv) out2.csv
{TOPK} \\g |cat
{HAVING} \\gdesc
\\echo :ROW_COUNT :SQLSTATE
"""
    rc, out, err = same(px, data, tmp_path, script)
    assert rc == 0
    for f in ("out1.txt", "out2.csv"):
        assert (tmp_path / "proxied" / f).read_text() == (tmp_path / "direct" / f).read_text()
    with psycopg.connect(px[1], autocommit=True) as c:
        assert explain(c, top1)["decision"] == "use"


def test_crosstabview(px: tuple[ProxyProcess, str], data: str, tmp_path: Path) -> None:
    q = ("SELECT g, s, count(*) FROM hp GROUP BY g, s HAVING count(*) >= 15 AND g < 6"
         " ORDER BY g, s")
    script = f"{q} \\crosstabview\n{q} \\crosstabview\n{q} \\crosstabview s g\n"
    rc, out, err = same(px, data, tmp_path, script)
    assert rc == 0 and "x0" in out
    with psycopg.connect(px[1], autocommit=True) as c:
        assert explain(c, q)["decision"] == "use"


def test_copy_of_sketched_query(px: tuple[ProxyProcess, str], data: str,
                                tmp_path: Path) -> None:
    script = f"""
\\copy ({HAVING}) to 'h.csv' csv header
\\copy ({TOPK}) to 'k.csv'
COPY ({HAVING}) TO STDOUT;
{HAVING};
COPY ({TOPK}) TO STDOUT (FORMAT csv);
CREATE TEMP TABLE cp (g int, s bigint);
\\copy cp from 'k.csv'
SELECT * FROM cp ORDER BY g;
\\copy cp from 'nonexistent.csv'
\\copy cp from 'h.csv' csv header
"""
    rc, out, err = same(px, data, tmp_path, script)
    for f in ("h.csv", "k.csv"):
        assert (tmp_path / "proxied" / f).read_text() == (tmp_path / "direct" / f).read_text()
    assert "extra data" in err


def test_large_objects(px: tuple[ProxyProcess, str], data: str, tmp_path: Path) -> None:
    for d in ("proxied", "direct"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "blob.bin").write_bytes(bytes(range(256)) * 40)
    script = f"""
{HAVING};
\\lo_import blob.bin 'hunt blob'
\\set oid :LASTOID
SELECT length(lo_get(:oid));
{TOPK};
\\lo_export :oid exported.bin
\\lo_list
\\lo_unlink :oid
\\lo_list
{HAVING};
"""
    proxied, direct = both(px, data, tmp_path, script)
    oid = re.compile(r"\b\d{4,}\b")
    assert (proxied[0], oid.sub("OID", proxied[1]), oid.sub("OID", proxied[2])) == \
        (direct[0], oid.sub("OID", direct[1]), oid.sub("OID", direct[2]))
    assert (tmp_path / "proxied" / "exported.bin").read_bytes() == \
        (tmp_path / "direct" / "exported.bin").read_bytes()
    assert proxied[0] == 0
    still_used(px)


def test_fetch_count(px: tuple[ProxyProcess, str], data: str, tmp_path: Path) -> None:
    script = f"""
\\set FETCH_COUNT 2
{HAVING};
{TOPK};
{HAVING};
SELECT g, count(*) FROM hp GROUP BY g HAVING count(*) >= 100 ORDER BY g;
\\set FETCH_COUNT 1
{TOPK};
SELECT g, count(*) FROM hp GROUP BY g HAVING count(*) >= 100 ORDER BY g;
SELECT g, count(*) FROM hp GROUP BY g HAVING count(*) / (g - 30) >= 0 ORDER BY g;
{HAVING};
"""
    rc, out, err = same(px, data, tmp_path, script)
    assert "division by zero" in err
    still_used(px)


def test_timing_and_errverbose(px: tuple[ProxyProcess, str], data: str,
                               tmp_path: Path) -> None:
    script = f"""
\\timing on
{HAVING};
{TOPK};
\\timing off
SELECT g, sum(v) FROM hp GROUP BY g HAVING sum(v) > 'abc';
\\errverbose
{HAVING};
SELECT g, sum(v) FROM hp GROUP BY g HAVING sum(v) / (g - 7) > 1 ORDER BY g;
\\errverbose
SELECT g, sum(nope) FROM hp GROUP BY g HAVING sum(v) > 10;
\\errverbose
\\set VERBOSITY verbose
SELECT g, sum(v)::smallint FROM hp GROUP BY g HAVING sum(v) > 10 ORDER BY 2 DESC LIMIT 2;
\\set VERBOSITY sqlstate
SELECT g, count(*) FROM hp GROUP BY g HAVING count(*) > 1 ORDER BY g LIMIT 2;
SELECT 1/0;
\\echo :LAST_ERROR_SQLSTATE :LAST_ERROR_MESSAGE
"""
    proxied, direct = both(px, data, tmp_path, script)
    t = re.compile(r"Time: [0-9.]+ ms")
    assert (proxied[0], t.sub("T", proxied[1]), proxied[2]) == \
        (direct[0], t.sub("T", direct[1]), direct[2])


def test_echo_hidden_describe(px: tuple[ProxyProcess, str], data: str,
                              tmp_path: Path) -> None:
    script = f"""
{HAVING};
\\d+ hp
\\dt
\\dt+ hp
\\df lower
\\dn
\\di hp*
{TOPK};
\\l hunt_nothing
\\conninfo
"""
    rc, out, err = same(px, data, tmp_path, script, "-E")
    assert rc == 0


def test_variables(px: tuple[ProxyProcess, str], data: str, tmp_path: Path) -> None:
    script = """
\\set tbl hp
\\set col g
\\set thr 990
\\set txt x3
SELECT :"col", count(*) AS n, max(v) AS m FROM :"tbl" GROUP BY :"col"
  HAVING max(v) >= :thr ORDER BY :"col";
SELECT :"col", count(*) AS n, max(v) AS m FROM :tbl GROUP BY :col
  HAVING max(v) >= :'thr'::int ORDER BY :"col";
SELECT s, count(*) FROM hp WHERE s <> :'txt' GROUP BY s HAVING count(*) > 100 ORDER BY s;
SELECT s, count(*) FROM hp WHERE s <> :'txt' GROUP BY s HAVING count(*) > 100 ORDER BY s;
SELECT :'undefined_var';
"""
    rc, out, err = same(px, data, tmp_path, script, "-v", "thr=980")
    assert "syntax error" in err


def test_copy_from_stdin_after_sketched_query(px: tuple[ProxyProcess, str], data: str,
                                              tmp_path: Path) -> None:
    script = f"""
{HAVING};
CREATE TEMP TABLE cin (a int, b text);
COPY cin FROM STDIN;
1\tone
2\ttwo
\\.
{TOPK};
COPY cin FROM STDIN (FORMAT csv);
3,three
bad,row
\\.
{HAVING};
SELECT * FROM cin ORDER BY a;
"""
    rc, out, err = same(px, data, tmp_path, script)
    assert "invalid input syntax" in err


def test_syntax_error_midway(px: tuple[ProxyProcess, str], data: str, tmp_path: Path) -> None:
    script = f"""
{HAVING};
SELEC g FROM hp;
{TOPK};
SELECT g, count(*) FROM hp GROUP BY g HAVING count(*) >> 1 ORDER BY g;
SELECT g, count(*) FROM hp GROUP BY g HAVING (count(*) > 1 ORDER BY g;
{HAVING}
"""
    rc, out, err = same(px, data, tmp_path, script)
    assert err.count("syntax error") >= 2
    rc, out, err = same(px, data, tmp_path / "stop", script, "-v", "ON_ERROR_STOP=1")
    assert rc == 3


def test_psqlrc_like_settings(px: tuple[ProxyProcess, str], data: str, tmp_path: Path) -> None:
    script = f"""
{HAVING};
{TOPK};
SELECT g, count(*) FROM hp GROUP BY g HAVING count(*) > 99 AND g IS NULL;
SELECT 1/0;
{TOPK};
"""
    args = ("-v", "VERBOSITY=verbose", "-v", "SHOW_CONTEXT=always", "-v", "ECHO=queries",
            "-v", "ON_ERROR_ROLLBACK=on", "-P", "null=<NULL>", "-P", "border=2",
            "-v", "PROMPT1=%n@%/%R%# ", "-v", "HISTSIZE=0", "-P", "pager=off")
    same(px, data, tmp_path, script, *args)
    same(px, data, tmp_path / "ac", script, *args, "-v", "AUTOCOMMIT=off")
    same(px, data, tmp_path / "fc", script, *args, "-v", "FETCH_COUNT=3")
    same(px, data, tmp_path / "stdin", script, *args, stdin=script)



@pytest.fixture(scope="module")
def latin(data: str) -> str:
    with psycopg.connect(data, autocommit=True) as c:
        c.execute("CREATE TABLE he (id int PRIMARY KEY, k text, w int)"
                  " WITH (autovacuum_enabled = false)")
        c.execute("INSERT INTO he SELECT i, (ARRAY['é','ü','a','ß','ø','z'])[i % 6 + 1]"
                  " || (i % 40), i % 97 FROM generate_series(1, 4000) i")
        c.execute("ANALYZE he")
    return data


def test_encoding_changes(px: tuple[ProxyProcess, str], latin: str, tmp_path: Path) -> None:
    """\\encoding / SET client_encoding between sketched queries over a text column with
    non-ASCII values: the script's bytes are in the encoding psql announces (psql sends them
    as they are); an ASCII-only query (`a`) is sketched with non-ASCII range bounds."""
    a = "SELECT k, sum(w) AS s FROM he GROUP BY k ORDER BY s DESC, k LIMIT 4"
    q = ("SELECT k, count(*), max(w) FROM he WHERE k <> 'é1' GROUP BY k HAVING max(w) >= 96"
         " ORDER BY k")
    t = "SELECT k, sum(w) AS s FROM he WHERE k >= 'ß' GROUP BY k ORDER BY s DESC, k LIMIT 3"
    parts = [(f"{q};\n{q};\n{t};\n{t};\n{q};\n{a};\n{a};\n", "utf-8"),
             (f"\\encoding LATIN1\n{a};\n{q};\n{t};\nSET client_encoding = 'WIN1252';\n{q};\n{t};\n"
              "SHOW client_encoding;\n", "latin-1"),
             (f"\\encoding UTF8\n{q};\n{t};\n", "utf-8"),
             (f"\\encoding LATIN2\n{q};\n{t};\n", "latin-1"),
             (f"\\encoding LATIN1\nSELECT 1;\n\\encoding UTF8\n{q};\n{t};\n", "utf-8")]
    data = b"".join(txt.encode(enc) for txt, enc in parts)
    for d in ("proxied", "direct"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "s.sql").write_bytes(data)
    outs = []
    for name, dsn in (("proxied", px[1]), ("direct", latin)):
        res = subprocess.run(["psql", "-X", "-d", dsn, "-f", "s.sql"], cwd=tmp_path / name,
                             capture_output=True, timeout=60)
        outs.append((res.returncode, res.stdout, res.stderr))
    assert outs[0] == outs[1]
    with psycopg.connect(px[1], autocommit=True) as c:
        for x in (q, t, a):
            # text keys are maintained by recapture: a foreign commit meanwhile recaptures
            assert explain(c, x)["decision"] in ("use", "capture"), x


def test_multi_statement_query_strings(px: tuple[ProxyProcess, str], data: str,
                                       tmp_path: Path) -> None:
    """`\\;` sends several statements in one simple Query."""
    script = f"""
{HAVING} \\; {TOPK};
SELECT 1 AS one \\; {TOPK} \\; {HAVING};
BEGIN \\; {TOPK} \\; COMMIT;
{TOPK} \\; SELECT 1/0 \\; {HAVING};
SET statement_timeout = '5s' \\; {HAVING} \\; RESET statement_timeout;
{TOPK} \\; BEGIN;
{HAVING};
COMMIT \\; {TOPK};
{HAVING} \\gx
SELECT 2 AS two \\; {TOPK} \\gset
\\echo :g :s
"""
    rc, out, err = same(px, data, tmp_path, script)
    assert "division by zero" in err
    still_used(px)


def test_gexec_of_sketched_queries(px: tuple[ProxyProcess, str], data: str,
                                   tmp_path: Path) -> None:
    script = """
SELECT format('SELECT g, count(*) AS n FROM hp GROUP BY g HAVING max(v) >= %s'
              ' ORDER BY g LIMIT 3', m)
  FROM (VALUES (999), (995), (999), (990), (999)) t(m) \\gexec
SELECT format('SELECT g, sum(v) AS s FROM hp GROUP BY g ORDER BY s %s, g LIMIT %s', d, k)
  FROM (VALUES ('DESC', 2), ('ASC', 2), ('DESC', 1), ('DESC', 2)) t(d, k) \\gexec
SELECT 'SELECT g, count(*) FROM hp GROUP BY g HAVING max(v) >= 1/0', 'SELECT 42' \\gexec
"""
    rc, out, err = same(px, data, tmp_path, script)
    assert "division by zero" in err and "42" in out
    with psycopg.connect(px[1], autocommit=True) as c:
        q = "SELECT g, count(*) AS n FROM hp GROUP BY g HAVING max(v) >= 999 ORDER BY g LIMIT 3"
        assert explain(c, q)["decision"] == "use"


def test_session_settings_and_variables(px: tuple[ProxyProcess, str], data: str,
                                        tmp_path: Path) -> None:
    """What psql shows of the session after sketched queries: \\dconfig (non-default
    settings), SHOW of what the proxy's wrapping touches, psql's server variables."""
    script = f"""
{HAVING};
{TOPK};
\\dconfig
SHOW transaction_isolation;
SHOW idle_in_transaction_session_timeout;
SHOW statement_timeout;
SHOW application_name;
SHOW search_path;
SELECT name, setting, source FROM pg_settings WHERE source NOT IN ('default', 'override')
  AND name NOT IN ('port') ORDER BY name;
\\echo :SERVER_VERSION_NUM :SERVER_VERSION_NAME :ENCODING :USER :DBNAME :SESSION_USER
\\echo :VERSION_NUM
SET application_name = 'hunt';
{HAVING};
SHOW application_name;
SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ;
{TOPK};
SHOW transaction_isolation;
SHOW default_transaction_isolation;
RESET ALL;
{TOPK};
\\dconfig
"""
    rc, out, err = same(px, data, tmp_path, script)
    assert rc == 0 and err == ""


def test_reconnect_mid_script(px: tuple[ProxyProcess, str], data: str, tmp_path: Path,
                              fresh_db: Any) -> None:
    script = f"""
{HAVING};
\\set mydb :DBNAME
\\c
{TOPK};
SELECT current_database() = :'mydb';
\\c - - - -
{HAVING};
\\c postgres
SELECT current_database();
\\c :mydb
{TOPK};
\\c no_such_database_hunt
{HAVING};
"""
    proxied, direct = both(px, data, tmp_path, script)
    strip = re.compile(r'You are now connected to database "[^"]*" as user "[^"]*"'
                       r'( on host "[^"]*" at port "\d+")?\.|port \d+ failed')
    assert (proxied[0], strip.sub("X", proxied[1]), strip.sub("X", proxied[2])) == \
        (direct[0], strip.sub("X", direct[1]), strip.sub("X", direct[2]))
    assert "no_such_database_hunt" in proxied[2]


def test_copy_variants(px: tuple[ProxyProcess, str], data: str, tmp_path: Path) -> None:
    script = f"""
{HAVING};
\\copy ({TOPK}) to stdout
\\copy ({TOPK}) to program 'cat'
\\copy ({HAVING}) to stdout with (format csv, header true, force_quote *)
CREATE TEMP TABLE cq (g int, s bigint);
\\copy cq from stdin
1\t2
3\t4
\\.
{TOPK};
\\copy cq from stdin csv
5,x
\\.
SELECT * FROM cq ORDER BY g;
BEGIN;
\\copy ({HAVING}) to stdout
{TOPK};
ROLLBACK;
"""
    rc, out, err = same(px, data, tmp_path, script)
    assert 'invalid input syntax for type bigint: "x"' in err
    still_used(px)


def test_large_object_in_transaction(px: tuple[ProxyProcess, str], data: str,
                                     tmp_path: Path) -> None:
    for d in ("proxied", "direct"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "b.bin").write_bytes(b"\x00\xff" * 50000)
    script = f"""
{TOPK};
BEGIN;
\\lo_import b.bin
SELECT count(*) FROM pg_largeobject_metadata WHERE oid = :LASTOID;
{HAVING};
ROLLBACK;
SELECT count(*) FROM pg_largeobject_metadata WHERE oid = :LASTOID;
\\lo_export 1 nothing.bin
\\lo_unlink 1
{TOPK};
"""
    proxied, direct = both(px, data, tmp_path, script)
    oid = re.compile(r"\b\d{4,}\b")
    assert (proxied[0], oid.sub("OID", proxied[1]), oid.sub("OID", proxied[2])) == \
        (direct[0], oid.sub("OID", direct[1]), oid.sub("OID", direct[2]))
    assert "large object 1 does not exist" in proxied[2]


def imp_as_select(script: str) -> str:
    return re.sub(r"IMP [^\\\n]*\\g", r"SELECT 1 \\g", script)


def test_imp_statements_keep_transaction_status(px: tuple[ProxyProcess, str], data: str,
                                                tmp_path: Path) -> None:
    """psql decides on BEGIN (AUTOCOMMIT off) and on its savepoints (ON_ERROR_ROLLBACK)
    from the transaction status of the last ReadyForQuery: an IMP statement answered by the
    proxy inside a transaction must report it as PostgreSQL would for a SELECT."""
    body = f"""
{HAVING};
IMP SHOW STATS \\g /dev/null
{TOPK};
IMP EXPLAIN {TOPK} \\g /dev/null
SELECT 1/0;
{HAVING};
\\echo :SQLSTATE
COMMIT;
BEGIN;
IMP SHOW STATS \\g /dev/null
SHOW transaction_isolation;
ROLLBACK;
"""
    for name, args in (("ac", ("-v", "AUTOCOMMIT=off")),
                       ("acrb", ("-v", "AUTOCOMMIT=off", "-v", "ON_ERROR_ROLLBACK=on")),
                       ("rb", ("-v", "ON_ERROR_ROLLBACK=on"))):
        got = psql(px[1], body, *args, cwd=tmp_path / name / "p")
        want = psql(data, imp_as_select(body), *args, cwd=tmp_path / name / "d")
        assert got == want, name


def test_errverbose_permission_errors(px: tuple[ProxyProcess, str], data: str,
                                      tmp_path: Path) -> None:
    with psycopg.connect(data, autocommit=True) as c:
        c.execute("DROP OWNED BY hunt_ro" if c.execute(
            "SELECT 1 FROM pg_roles WHERE rolname = 'hunt_ro'").fetchone() else "SELECT 1")
        c.execute("DROP ROLE IF EXISTS hunt_ro")
        c.execute("CREATE ROLE hunt_ro")
        c.execute("GRANT SELECT (g, s) ON hp TO hunt_ro")
    script = f"""
{HAVING};
SET ROLE hunt_ro;
{HAVING};
\\errverbose
{TOPK};
\\errverbose
SELECT g, count(*) FROM hp GROUP BY g HAVING count(*) > 99 ORDER BY g LIMIT 3;
SELECT g, count(*) FROM hp GROUP BY g HAVING count(*) > 99 ORDER BY g LIMIT 3;
SELECT s, count(*) FROM hp GROUP BY s HAVING count(*) > 800 ORDER BY s;
\\set VERBOSITY verbose
{TOPK};
RESET ROLE;
{TOPK};
\\errverbose
"""
    rc, out, err = same(px, data, tmp_path, script)
    assert "permission denied for table hp" in err and "42501" in err


def test_empty_results_and_row_count(px: tuple[ProxyProcess, str], data: str,
                                     tmp_path: Path) -> None:
    none = "SELECT g AS eg, max(v) AS em FROM hp GROUP BY g HAVING max(v) >= 5000"
    script = f"""
{none};
{none};
{none} \\gset
\\echo :ROW_COUNT :ERROR
{HAVING};
\\echo :ROW_COUNT
{none} \\crosstabview
{none} \\gx
SELECT g, sum(v) AS s FROM hp WHERE v > 5000 GROUP BY g ORDER BY s DESC, g LIMIT 3;
SELECT g, sum(v) AS s FROM hp WHERE v > 5000 GROUP BY g ORDER BY s DESC, g LIMIT 3;
\\echo :ROW_COUNT
"""
    rc, out, err = same(px, data, tmp_path, script)
    assert "no rows returned for \\gset" in err
    with psycopg.connect(px[1], autocommit=True) as c:
        assert explain(c, none)["decision"] == "use"


def test_explain_and_sql_prepare(px: tuple[ProxyProcess, str], data: str,
                                 tmp_path: Path) -> None:
    script = f"""
EXPLAIN (COSTS OFF) {HAVING};
EXPLAIN (COSTS OFF) {TOPK};
PREPARE ph(int) AS SELECT g, count(*) AS n, max(v) AS m FROM hp GROUP BY g
  HAVING max(v) >= $1 ORDER BY g;
EXECUTE ph(990);
EXECUTE ph(995);
EXECUTE ph(990);
DEALLOCATE ph;
EXECUTE ph(990);
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) {TOPK};
"""
    rc, out, err = same(px, data, tmp_path, script)
    assert "prepared statement \"ph\" does not exist" in err


def test_command_line_modes(px: tuple[ProxyProcess, str], data: str, tmp_path: Path) -> None:
    for i, args in enumerate((
            ("-c", HAVING, "-c", TOPK),
            ("-c", f"SELECT 1; {HAVING}; {TOPK}"),
            ("-c", f"{TOPK}; SELECT 1/0; {HAVING}"),
            ("-A", "-t", "-F,", "-c", HAVING),
            ("--csv", "-c", TOPK),
            ("-x", "-c", TOPK),
            ("-H", "-c", HAVING),
            ("-1", "-c", HAVING, "-c", TOPK),
            ("-v", "ON_ERROR_STOP=1", "-c", "SELECT 1/0", "-c", HAVING),
            ("-c", f"BEGIN; {HAVING}; COMMIT; {TOPK}"),
    )):
        p = psql(px[1], "", *args, cwd=tmp_path / str(i) / "p")
        d = psql(data, "", *args, cwd=tmp_path / str(i) / "d")
        assert p == d, args


def test_copy_into_sketched_table(px: tuple[ProxyProcess, str], data: str,
                                  tmp_path: Path) -> None:
    """COPY FROM STDIN / \\copy FROM into the sketched table between sketched queries (the
    audit triggers see the rows); the script removes its rows again, so both runs start
    from the same state."""
    for d in ("proxied", "direct"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "rows.csv").write_text("900011,61,1000,y\n900012,5,2000,y\n")
    script = f"""
{HAVING};
{TOPK};
COPY hp FROM STDIN;
900001\t61\t999\tz
900002\t3\t5000\tz
\\.
{HAVING};
{TOPK};
\\copy hp from 'rows.csv' csv
{HAVING};
{TOPK};
BEGIN;
COPY hp FROM STDIN (FORMAT csv);
900003,62,1000,q
\\.
{TOPK};
ROLLBACK;
{TOPK};
{HAVING};
DELETE FROM hp WHERE id > 900000;
{HAVING};
{TOPK};
"""
    rc, out, err = same(px, data, tmp_path, script)
    assert rc == 0 and err == "" and "| 61 |" not in out and " 61 |" in out
    still_used(px)
