"""Scratch hunt (session 37 helper): upgrades from f86e918 (old proxy from a git work tree at
/tmp/up37old) to HEAD. Old proxies run with PYTHONPATH=/tmp/up37old; new ones with the
``launch`` fixture. Every answer is compared with PostgreSQL."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench.proxy_process import ProxyProcess

from .conftest import LaunchProxy, scalar, via_proxy, wait_until

OLD = Path("/tmp/up37old")
NEW = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not OLD.is_dir(), reason="no old work tree")

_LISTENING = re.compile(r"imp-proxy listening on [^\s]+:(\d+)")

QUERIES = [
    "SELECT g, count(*) AS n FROM h GROUP BY g HAVING count(*) > 45 ORDER BY g",
    "SELECT g, sum(v) AS s FROM h GROUP BY g HAVING sum(v) > 1500 ORDER BY g",
    "SELECT g, max(v) AS m FROM h GROUP BY g ORDER BY m DESC, g LIMIT 5",
]
FAST = ("--library-setting", "state_interval=0.3", "--library-setting", "batch_interval=0.3")


def _launch_tree(tree: Path, upstream: str, *args: str) -> ProxyProcess:
    log = Path(tempfile.mkstemp(prefix="imp-proxy-old-", suffix=".log",
                                dir=os.environ.get("IMP_PROXY_LOG_DIR"))[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "imp_proxy", "--log-level", "INFO", "serve",
             "--listen", "127.0.0.1:0", "--upstream", upstream, *args],
            stdout=out, stderr=subprocess.STDOUT, cwd=tree, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = _LISTENING.search(log.read_text(errors="replace"))
        if m:
            return ProxyProcess(proc, int(m.group(1)), log)
        if proc.poll() is not None:
            raise RuntimeError(log.read_text())
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise RuntimeError("old proxy did not start")


@pytest.fixture
def launch_old() -> Any:
    started: list[ProxyProcess] = []

    def start(upstream: str, *args: str) -> ProxyProcess:
        p = _launch_tree(OLD, upstream, *args)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


def _install(tree: Path, dsn: str) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    r = subprocess.run([sys.executable, "-m", "imp_proxy", "install", "--upstream", dsn],
                       cwd=tree, env=env, capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout.decode() + r.stderr.decode()


def _rows(dsn: str, q: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(q.encode()).fetchall()


def _check(proxied: str, direct: str, where: str) -> None:
    for q in QUERIES:
        got, want = _rows(proxied, q), _rows(direct, q)
        assert got == want, (where, q, got, want)


def _sketches(proxied: str) -> list[dict[str, Any]]:
    with psycopg.connect(proxied, autocommit=True) as c:
        cur = c.execute("IMP SHOW SKETCHES")
        names = [d.name for d in cur.description or []]
        return [dict(zip(names, r)) for r in cur.fetchall()]


def _totals(proxied: str) -> tuple[int, int, int]:
    s = _sketches(proxied)
    return (sum(int(x["captures"]) for x in s), sum(int(x["maintenances"]) for x in s),
            sum(int(x["uses"]) for x in s))


def _load(direct: str) -> None:
    with psycopg.connect(direct, autocommit=True) as c:
        c.execute("CREATE TABLE h (id serial PRIMARY KEY, g int NOT NULL, v int NOT NULL)")
        c.execute("INSERT INTO h (g, v) SELECT g, i FROM generate_series(0, 49) g,"
                  " generate_series(1, 40 + g % 20) i")
        c.execute("ANALYZE h")


def _write(dsn: str, n: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO h (g, v) SELECT %s, i FROM generate_series(1, 7) i", (n % 50,))
        c.execute("DELETE FROM h WHERE id IN (SELECT id FROM h WHERE g = %s LIMIT 3)",
                  ((n * 7 + 3) % 50,))
        c.execute("UPDATE h SET v = v + 30 WHERE g = %s", ((n * 11 + 5) % 50,))


def _warm(proxied: str, direct: str, rounds: int = 6) -> None:
    for i in range(rounds):
        _check(proxied, direct, f"warm {i}")
        time.sleep(0.3)


def _persisted(direct: str) -> int:
    if not scalar(direct, "SELECT to_regclass('imp.ivm_state') IS NOT NULL"):
        return 0
    return int(scalar(direct, "SELECT count(*) FROM imp.ivm_state"))


def _trig(direct: str) -> list[tuple[Any, ...]]:
    return _rows(direct, "SELECT c.relname, t.tgname, t.tgenabled FROM pg_trigger t"
                         " JOIN pg_class c ON c.oid = t.tgrelid WHERE t.tgname LIKE 'imp%'"
                         " ORDER BY 1, 2")


@pytest.mark.parametrize("strategy", ["lazy", "eager"])
def test_old_then_new_before_and_after_install(fresh_db: Any, launch: LaunchProxy,
                                               launch_old: Any, strategy: str) -> None:
    direct = str(fresh_db())
    _load(direct)
    args = (*FAST, "--library-setting", f"strategy={strategy}")
    old = launch_old(direct, *args)
    po = via_proxy(direct, old.port)
    _warm(po, direct)
    for n in range(4):
        _write(direct, n)
        _check(po, direct, f"old after write {n}")
    assert wait_until(lambda: _persisted(direct) > 0, timeout=20, interval=0.3)
    old_tot = _totals(po)
    print("old totals", old_tot)
    assert old_tot[0] >= 1 and old_tot[2] >= 1
    old.stop()
    _write(direct, 10)
    # new proxy on the old SQL
    new = launch(*args, upstream=direct)
    pn = via_proxy(direct, new.port)
    for n in range(11, 17):
        _check(pn, direct, f"new/old-sql before write {n}")
        _write(direct, n)
        time.sleep(0.4)
        _check(pn, direct, f"new/old-sql after write {n}")
    t1 = _totals(pn)
    print("new on old sql", t1, _sketches(pn))
    out = _install(NEW, direct)
    print("install:", out)
    print(_trig(direct))
    for n in range(20, 26):
        _write(direct, n)
        time.sleep(0.4)
        _check(pn, direct, f"new/new-sql after write {n}")
    t2 = _totals(pn)
    print("new after install", t2, _sketches(pn))
    new.stop()
    _write(direct, 30)
    new2 = launch(*args, upstream=direct)
    pn2 = via_proxy(direct, new2.port)
    for n in range(31, 37):
        _check(pn2, direct, f"restarted new before write {n}")
        _write(direct, n)
        time.sleep(0.4)
        _check(pn2, direct, f"restarted new after write {n}")
    t3 = _totals(pn2)
    print("new restarted", t3, _sketches(pn2))
    assert t2[1] > t1[1], ("no maintenance after install", t1, t2)
    assert t3[1] > 0 and t3[0] <= len(QUERIES), ("recapture after restart", t3)
