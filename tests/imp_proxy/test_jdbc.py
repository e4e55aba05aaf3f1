"""pgjdbc (Debian's /usr/share/java/postgresql.jar) through the proxy vs directly."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest

from .conftest import ProxyProcess, StartProxy, via_proxy

ROOT = Path(__file__).resolve().parents[2]
JAR = Path("/usr/share/java/postgresql.jar")
SOURCE = ROOT / "tests" / "java" / "JdbcCheck.java"


@pytest.fixture(scope="module")
def jdbc_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not JAR.exists() or shutil.which("javac") is None:
        pytest.skip("pgjdbc jar or javac missing (scripts/bootstrap.sh installs them)")
    out = tmp_path_factory.mktemp("jdbc")
    subprocess.run(["javac", "-cp", str(JAR), "-d", str(out), str(SOURCE)], check=True,
                   capture_output=True, timeout=120)
    return out


def jdbc(classes: Path, url: str, *args: str, jvm: tuple[str, ...] = ()) -> str:
    res = subprocess.run(["java", *jvm, "-cp", f"{JAR}:{classes}", "JdbcCheck", url, *args],
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    return res.stdout


def url_for(dsn: str, port: int | None = None, **params: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    q = "&".join(f"{k}={v}" for k, v in {"user": str(info["user"]), **params}.items())
    return f"jdbc:postgresql://127.0.0.1:{port or info['port']}/{info['dbname']}?{q}"


@pytest.mark.parametrize("threshold", ["1", "5"])
def test_jdbc_transcript_same_as_direct(jdbc_classes: Path, db_dsn: str, proxy: ProxyProcess,
                                        threshold: str) -> None:
    direct = jdbc(jdbc_classes, url_for(db_dsn, prepareThreshold=threshold), "basic")
    proxied = jdbc(jdbc_classes, url_for(db_dsn, proxy.port, prepareThreshold=threshold),
                   "basic")
    assert proxied == direct
    assert "batch 200 200" in proxied and "fetch 1000 500500" in proxied
    assert "error 42P01" in proxied and "aborted 25P02" in proxied
    assert "multi 1 two upd=4" in proxied


def test_jdbc_binary_transfer_and_options(jdbc_classes: Path, db_dsn: str,
                                          proxy: ProxyProcess) -> None:
    params = {"prepareThreshold": "-1", "binaryTransfer": "true",
              "options": "-c%20search_path%3Dpublic", "ApplicationName": "jdbc-imp"}
    direct = jdbc(jdbc_classes, url_for(db_dsn, **params), "basic")
    assert jdbc(jdbc_classes, url_for(db_dsn, proxy.port, **params), "basic") == direct


def test_jdbc_cancel(jdbc_classes: Path, db_dsn: str, proxy: ProxyProcess) -> None:
    out = jdbc(jdbc_classes, url_for(db_dsn, proxy.port), "cancel")
    assert out.splitlines() == ["cancelled 57014 fast=true", "after cancel usable"]


def test_jdbc_50_concurrent_clients(jdbc_classes: Path, db_dsn: str,
                                    proxy: ProxyProcess) -> None:
    out = jdbc(jdbc_classes, url_for(db_dsn, proxy.port, prepareThreshold="1"),
               "concurrent", "50")
    assert out.strip() == "concurrent ok 50"


@pytest.mark.parametrize("params", [{"prepareThreshold": "1"},
                                    {"prepareThreshold": "1", "binaryTransfer": "false"},
                                    {"prepareThreshold": "5"}])
def test_jdbc_sketch_wrapping(jdbc_classes: Path, db_dsn: str, start_proxy: StartProxy,
                              params: dict[str, str]) -> None:
    """pgjdbc's unnamed and server-prepared (named, binary-parameter) statements are wrapped
    and return exactly what PostgreSQL returns."""
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS probe (id bigserial PRIMARY KEY, grp int)")
        c.execute("TRUNCATE probe")
        c.execute("INSERT INTO probe (grp) SELECT g % 3 FROM generate_series(1, 90) g")
    hooked = start_proxy(hook="tests.imp_proxy.hooks:create_hook")
    direct = jdbc(jdbc_classes, url_for(db_dsn, **params), "probe")
    proxied = jdbc(jdbc_classes, url_for(db_dsn, hooked.port, **params), "probe")
    assert proxied == direct and proxied.count("probe ") == 6
    with psycopg.connect(via_proxy(db_dsn, hooked.port), autocommit=True) as c:
        s = dict(c.execute("IMP SHOW STATS").fetchall())
    assert s["proxy.wrapped"] == "6" and s["proxy.fallbacks"] == "0"
    assert s["hook.last_params"] == "[50, 2]"


def test_jdbc_in_another_timezone_gets_sketches(jdbc_classes: Path, db_dsn: str,
                                                start_proxy: StartProxy) -> None:
    """pgjdbc sets the session's TimeZone from the JVM's. A JVM in Asia/Tokyo against a
    server in another zone still gets its HAVING query (which reads no date or time) answered
    through a sketch, with exactly PostgreSQL's rows; its query on a timestamptz column passes
    through, also exact."""
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS jtz")
        c.execute("CREATE TABLE jtz (g int NOT NULL, v int NOT NULL, ts timestamptz NOT NULL)")
        c.execute("INSERT INTO jtz SELECT i % 500, i % 997, timestamptz '2019-12-31 12:00+00'"
                  " + i * interval '1 second' FROM generate_series(1, 100000) i")
        c.execute("ANALYZE jtz")
        server_zone = str(c.execute("SHOW TimeZone").fetchone()[0])  # type: ignore[index]
    assert server_zone != "Asia/Tokyo"
    hooked = start_proxy(sketches=True)
    jvm = ("-Duser.timezone=Asia/Tokyo",)
    free = "SELECT g, sum(v) FROM jtz GROUP BY g HAVING sum(v) > 101000 ORDER BY g"
    dated = ("SELECT g, count(*) FROM jtz WHERE ts < '2020-01-01 00:00' GROUP BY g"
             " HAVING count(*) > 80 ORDER BY g")
    for q in (free, dated):
        direct = jdbc(jdbc_classes, url_for(db_dsn), "repeat", q, "8", jvm=jvm)
        proxied = jdbc(jdbc_classes, url_for(db_dsn, hooked.port), "repeat", q, "8", jvm=jvm)
        assert proxied == direct and direct.startswith("timezone Asia/Tokyo\n")
        with psycopg.connect(via_proxy(db_dsn, hooked.port), autocommit=True,
                             options="-c TimeZone=Asia/Tokyo") as c:
            s = dict(c.execute("IMP SHOW STATS").fetchall())
            decision = dict(c.execute(f"IMP EXPLAIN {q}").fetchall())["decision"]
        if q == free:
            assert int(s["proxy.used"]) >= 1, s
            assert decision == "use", decision
        else:
            assert decision == "passthrough", decision
