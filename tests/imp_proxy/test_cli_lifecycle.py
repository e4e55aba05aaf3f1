"""The command line's failures and the embedded cluster's life, driven through the real
console script: every error is one clear message with an exit status (never a traceback,
never a password), and every PostgreSQL an ``imp-proxy`` started is stopped however it ends.
Found by a helper's search in session 23 (``tests/imp_proxy/test_config.py`` has the
configuration's precedence)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from imp_proxy.config import ConfigError, load_config
from tests.conftest import server_pids

ROOT = Path(__file__).resolve().parents[2]
EXE = str(ROOT / ".venv" / "bin" / "imp-proxy")


def run(*args: str, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    e = {**os.environ, **(env or {})}
    for k in ("IMP_LISTEN", "IMP_UPSTREAM", "IMP_CONFIG", "IMP_HEAVY_BACKEND"):
        if env is None or k not in env:
            e.pop(k, None)
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout,
                          env=e, cwd=ROOT)


def one_line_error(res: subprocess.CompletedProcess[str], status: int = 2) -> None:
    """A clean failure: the documented exit status, a message starting ``imp-proxy:``, no
    traceback and no password."""
    assert res.returncode == status, (res.returncode, res.stderr[-2000:])
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.stderr.startswith("imp-proxy: "), res.stderr[-2000:]
    assert "s3cret" not in res.stderr + res.stdout


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Serve:
    """``imp-proxy serve`` of this checkout; ``ignoring_sigint``: started as a shell without
    job control starts a background job, with SIGINT ignored."""

    def __init__(self, *args: str, env: dict[str, str] | None = None,
                 ignoring_sigint: bool = False) -> None:
        e = {**os.environ, **(env or {})}
        self.log = tempfile.NamedTemporaryFile("w+", prefix="imp-hunt-", suffix=".log")
        self.proc = subprocess.Popen([EXE, "serve", *args], stdout=self.log, stderr=self.log,
                                     env=e, cwd=ROOT, text=True,
                                     preexec_fn=_ignore_sigint if ignoring_sigint else None)
        self.port: int | None = None

    def output(self) -> str:
        return Path(self.log.name).read_text()

    def wait_listening(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.output().splitlines():
                if line.startswith("imp-proxy listening on "):
                    self.port = int(line.rsplit(":", 1)[1])
                    return self.port
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}: {self.output()}")
            time.sleep(0.05)
        raise AssertionError(f"serve not listening: {self.output()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def kill_postgres(marker: str) -> None:
    for pid in server_pids(marker):
        try:
            os.kill(pid, signal.SIGQUIT)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while server_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in server_pids(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def data_dir() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="imp-hunt-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        kill_postgres(str(base))
        shutil.rmtree(base, ignore_errors=True)


def test_missing_tls_file_is_a_clean_error() -> None:
    res = run("serve", "--listen", "127.0.0.1:0", "--upstream", "postgresql://u@127.0.0.1:1/d",
              "--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key",
              "--no-sketches", timeout=30)
    one_line_error(res)


@pytest.mark.parametrize("command", ["serve", "install"])
@pytest.mark.parametrize("where", ["a file", "under /proc"])
def test_an_unusable_data_dir_is_a_one_line_error(command: str, where: str,
                                                  tmp_path: Path) -> None:
    """A --data-dir that is a file or cannot be created ended serve and install with a
    traceback and status 1 (found by a helper's search)."""
    path = tmp_path / "file" if where == "a file" else Path("/proc/imp-proxy-test/x")
    if where == "a file":
        path.write_text("")
    listen = ["--listen", "127.0.0.1:0"] if command == "serve" else []
    res = run(command, "--data-dir", str(path), *listen, timeout=30)
    one_line_error(res)
    assert str(path) in res.stderr


@pytest.mark.parametrize("dsn", ["postgresql://u:s3cretpw@h:notaport/db",
                                 "host=h user=u password=s3cret pw",
                                 "host=h1,h2 user=u password=s3cret"])
def test_malformed_upstream_dsn_is_a_clean_error(dsn: str) -> None:
    res = run("serve", "--listen", "127.0.0.1:0", "--upstream", dsn, "--no-sketches",
              timeout=30)
    one_line_error(res)


def test_hook_that_cannot_be_imported_is_a_clean_error() -> None:
    res = run("serve", "--listen", "127.0.0.1:0", "--upstream", "postgresql://u@127.0.0.1:1/d",
              "--hook", "no_such_module:factory", timeout=30)
    one_line_error(res)


def test_install_against_unreachable_server_is_a_clean_error() -> None:
    res = run("install", "--upstream", "postgresql://u:s3cretpw@127.0.0.1:1/db", timeout=60)
    one_line_error(res, 4)
    assert "Connection refused" in res.stderr


def test_install_without_privileges_is_a_clean_error(admin_dsn: str) -> None:
    name = f"hunt_{os.getpid()}"
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
        c.execute(f"CREATE ROLE {name} LOGIN")
    try:
        with psycopg.connect(psycopg.conninfo.make_conninfo(admin_dsn, dbname=name),
                             autocommit=True) as c:
            c.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
            c.execute(f"REVOKE CREATE ON DATABASE {name} FROM PUBLIC")
        dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=name, user=name)
        res = run("install", "--upstream", dsn, timeout=60)
        one_line_error(res, 4)
        assert "permission denied" in res.stderr
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            c.execute(f"DROP ROLE IF EXISTS {name}")


@pytest.mark.parametrize("body", [b"\xff\xfelisten = 1\n", b"library = 5\n"])
def test_bad_config_file_is_a_configuration_error(tmp_path: Path, body: bytes) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_bytes(body)
    res = run("serve", "--config", str(cfg), "--upstream", "postgresql://u@127.0.0.1:1/d",
              "--listen", "127.0.0.1:0", "--no-sketches", timeout=30)
    assert res.returncode == 2 and "configuration error" in res.stderr, res.stderr[-1500:]


@pytest.mark.parametrize("how", ["flag", "file"])
def test_a_library_setting_out_of_range_is_a_one_line_configuration_error(
        tmp_path: Path, how: str) -> None:
    """The README's exit status 2 and one line, also for a value the library refuses
    (found by a documentation search in session 28: a traceback and exit status 1)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('[library]\nstrategy = "bogus"\n')
    given = (["--library-setting", "strategy=bogus"] if how == "flag"
             else ["--config", str(cfg)])
    res = run("serve", *given, "--upstream", "postgresql://u@127.0.0.1:1/d",
              "--listen", "127.0.0.1:0", timeout=30)
    assert res.returncode == 2 and res.stderr.startswith("imp-proxy: configuration error"), \
        res.stderr[-1500:]
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr[-1500:]


@pytest.mark.parametrize("body", ["service_pool_size = true\n", "service_pool_size = 2.9\n",
                                  "connect_timeout = nan\n"])
def test_wrongly_typed_config_values_are_rejected(body: str) -> None:
    path = Path(tempfile.mkstemp(suffix=".toml")[1])
    try:
        path.write_text(body)
        with pytest.raises(ConfigError):
            print(load_config({"config": str(path)}, env={}))
    finally:
        path.unlink()


def test_unknown_log_level_is_rejected() -> None:
    res = run("--log-level", "verbose", "serve", "--listen", "127.0.0.1:notaport", timeout=30)
    assert "invalid choice: 'VERBOSE'" in res.stderr and res.returncode == 2, res.stderr
    assert run("--log-level", "debug", "serve", "--listen", "127.0.0.1:notaport",
               timeout=30).returncode == 2   # any case; then the listen address fails


def assert_serves(s: Serve, timeout: float = 90) -> None:
    """``s`` listens and relays a query."""
    with _connect(s.wait_listening(timeout)) as c:
        assert c.execute("SELECT 1").fetchone() == (1,)


def _connect(port: int) -> psycopg.Connection:
    return psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres",
                           autocommit=True, connect_timeout=10)


@pytest.mark.slow
def test_killed_proxy_then_serve_again(data_dir: Path) -> None:
    """A serve killed with SIGKILL leaves its cluster running; found: the next serve reused
    it and never stopped it. It takes the cluster over, and stops it when it ends."""
    s = Serve("--listen", "127.0.0.1:0", "--data-dir", str(data_dir), "--no-sketches")
    try:
        s.wait_listening(90)
    finally:
        s.stop(signal.SIGKILL)
    assert server_pids(str(data_dir))  # orphan postgres keeps running (expected)
    s2 = Serve("--listen", "127.0.0.1:0", "--data-dir", str(data_dir), "--no-sketches")
    try:
        assert_serves(s2)
        assert s2.stop() == 0
    finally:
        s2.stop(signal.SIGKILL)
    left = server_pids(str(data_dir))
    assert not left, ("reused orphan cluster left running after serve exit", s2.output())


@pytest.mark.slow
def test_a_second_serve_of_one_data_dir_is_refused(data_dir: Path) -> None:
    """Found: a second serve reused the first one's cluster, which the first stopped when it
    ended, and the second relayed to nothing from then on. The data directory is locked."""
    a = Serve("--listen", "127.0.0.1:0", "--data-dir", str(data_dir), "--no-sketches")
    try:
        pa = a.wait_listening(90)
        res = run("serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir),
                  "--no-sketches", timeout=60)
        one_line_error(res, 3)
        assert f"in use by another imp-proxy (pid {a.proc.pid})" in res.stderr
        with _connect(pa) as c:   # the first serves on
            assert c.execute("SELECT 1").fetchone() == (1,)
        installed = run("install", "--data-dir", str(data_dir), timeout=60)   # uses it
        assert installed.returncode == 0, installed.stderr
        with _connect(pa) as c:
            assert c.execute("SELECT 1").fetchone() == (1,)
        assert a.stop() == 0
    finally:
        a.stop()
    assert not server_pids(str(data_dir))


@pytest.mark.slow
@pytest.mark.parametrize("sub", ["Application Support/imp#1", "100%"])
def test_data_dir_with_a_space_or_percent(data_dir: Path, sub: str) -> None:
    """Found: such a path reached libpq unencoded in the socket DSN, which it refused."""
    s = Serve("--listen", "127.0.0.1:0", "--data-dir", str(data_dir / sub), "--no-sketches")
    try:
        assert_serves(s)
    finally:
        s.stop()


def _wait_for(path: Path, s: Serve, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.002)
    assert path.exists(), s.output()


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "ignoring"), [(signal.SIGINT, False), (signal.SIGTERM, False),
                                               (signal.SIGINT, True)])
def test_signal_while_embedded_server_starts_leaves_nothing(data_dir: Path, sig: int,
                                                            ignoring: bool) -> None:
    """``ignoring``: a serve started with SIGINT ignored (a background job of a shell
    without job control, as ``nohup bash .ci/run &`` runs the suite) ignored one during the
    embedded cluster's start and kept running (found: this test failed in such CI runs)."""
    log = data_dir / "pg" / "server.log"  # opened just before postgres is spawned
    s = Serve("--listen", "127.0.0.1:0", "--data-dir", str(data_dir), "--no-sketches",
              ignoring_sigint=ignoring)
    try:
        _wait_for(log, s)
        s.proc.send_signal(sig)
        s.proc.wait(30)
        time.sleep(2)
        left = server_pids(str(data_dir))
    finally:
        s.stop(signal.SIGKILL)
    assert not left, (left, s.proc.returncode, s.output()[-1500:])


def test_upstream_conninfo_host_from_pghost_env(admin_dsn: str) -> None:
    """Found: with the host in PGHOST/PGPORT only, service connections (libpq) reached the
    server, but clients were relayed to /var/run/postgresql."""
    info = psycopg.conninfo.conninfo_to_dict(admin_dsn)
    env = {"PGHOST": str(info["host"]), "PGPORT": str(info["port"])}
    s = Serve("--listen", "127.0.0.1:0", "--upstream", "user=postgres dbname=postgres",
              "--no-sketches", env=env)
    try:
        assert_serves(s, 30)
    finally:
        s.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_serve_stopped_under_a_query_tells_its_client_as_postgresql_does(
        admin_dsn: str, sig: int) -> None:
    """Once listening, a stop signal is an orderly stop (status 0). A client with a query in
    flight gets PostgreSQL's fast-shutdown error, and the query's cancel is sent before the
    loop ends (found by a helper's search: the connection just closed, and asyncio logged
    the cancel's task destroyed while pending)."""
    s = Serve("--listen", "127.0.0.1:0", "--upstream", admin_dsn, "--no-sketches")
    try:
        port = s.wait_listening(30)
        info = psycopg.conninfo.conninfo_to_dict(admin_dsn)
        dsn = psycopg.conninfo.make_conninfo(admin_dsn, host="127.0.0.1", port=port,
                                             hostaddr=None)
        assert info["dbname"]
        with psycopg.connect(dsn, autocommit=True) as c:
            failure: list[BaseException] = []

            def query() -> None:
                try:
                    c.execute("SELECT pg_sleep(30)")
                except psycopg.Error as exc:
                    failure.append(exc)
            t = threading.Thread(target=query)
            t.start()
            time.sleep(1.0)
            assert s.stop(sig) == 0
            t.join(30)
        assert failure and getattr(failure[0], "sqlstate", None) == "57P01", failure
        assert "terminating connection due to administrator command" in str(failure[0])
        assert "Task was destroyed" not in s.output(), s.output()[-2000:]
    finally:
        s.stop()


@pytest.mark.parametrize("how", ["service=", "PGSERVICE"])
def test_upstream_named_by_a_connection_service(admin_dsn: str, tmp_path: Path,
                                                how: str) -> None:
    """Found by a helper's search: the host and port of a connection service
    (pg_service.conf) were never read; libpq connected, but clients were relayed to
    /var/run/postgresql:5432. A service libpq does not know is a one-line error."""
    info = psycopg.conninfo.conninfo_to_dict(admin_dsn)
    services = tmp_path / "pg_service.conf"
    services.write_text(f"[app]\nhost={info['host']}\nport={info['port']}\n"
                        "user=postgres\ndbname=postgres\n")
    env = {"PGSERVICEFILE": str(services)}
    if how == "PGSERVICE":
        env["PGSERVICE"] = "app"
    s = Serve("--listen", "127.0.0.1:0", "--upstream",
              "service=app" if how == "service=" else "connect_timeout=10", "--no-sketches",
              env=env)
    try:
        assert_serves(s, 30)
    finally:
        s.stop()
    res = run("serve", "--listen", "127.0.0.1:0", "--upstream", "service=nosuch",
              "--no-sketches", env=env, timeout=30)
    one_line_error(res)
    assert 'definition of service "nosuch" not found' in res.stderr


@pytest.mark.slow
def test_stale_pidfile_with_recycled_pid(data_dir: Path) -> None:
    """After a crash postmaster.pid survives, and after a reboot its PID may belong to an
    unrelated live process: found, serve took that for a running cluster and relayed to
    nothing. The stale file is removed and the cluster started."""
    s = Serve("--listen", "127.0.0.1:0", "--data-dir", str(data_dir), "--no-sketches")
    try:
        s.wait_listening(90)
    finally:
        s.stop(signal.SIGKILL)
    pidfile = data_dir / "pg" / "data" / "postmaster.pid"
    saved = pidfile.read_text()
    kill_postgres(str(data_dir))  # SIGQUIT: crash-like stop (removes pidfile)
    lines = saved.splitlines()
    lines[0] = str(os.getpid())  # a live, unrelated process (this pytest)
    pidfile.write_text("\n".join(lines) + "\n")
    shutil.chown(pidfile, "postgres", "postgres")
    s2 = Serve("--listen", "127.0.0.1:0", "--data-dir", str(data_dir), "--no-sketches")
    try:
        assert_serves(s2)
    finally:
        s2.stop()


@pytest.mark.slow
def test_sighup_leaves_no_embedded_server(data_dir: Path) -> None:
    """Closing the terminal of a foreground `imp-proxy serve` (or a reflex `kill -HUP` to
    reload) sends SIGHUP: found, the proxy died and left its embedded PostgreSQL running.
    It stops as on SIGTERM (there is no configuration reload)."""
    s = Serve("--listen", "127.0.0.1:0", "--data-dir", str(data_dir), "--no-sketches")
    try:
        s.wait_listening(90)
        s.proc.send_signal(signal.SIGHUP)
        s.proc.wait(30)
        time.sleep(1)
        left = server_pids(str(data_dir))
    finally:
        s.stop(signal.SIGKILL)
    assert s.proc.returncode == 0 and not left, (s.proc.returncode, left, s.output()[-1000:])


@pytest.mark.parametrize("flag", ["--startup-timeout", "--connect-timeout"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_non_finite_timeouts(admin_dsn: str, flag: str, value: str) -> None:
    """Found: a NaN timeout was accepted; clients then hung, or were dropped at once."""
    res = run("serve", "--listen", "127.0.0.1:0", "--upstream", admin_dsn, "--no-sketches",
              flag, value, timeout=30)
    one_line_error(res)
    assert "positive number of seconds" in res.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-0.5"])
def test_batch_wait_must_be_a_finite_number_of_seconds(admin_dsn: str, value: str) -> None:
    res = run("serve", "--listen", "127.0.0.1:0", "--upstream", admin_dsn, "--no-sketches",
              "--batch-wait", value, timeout=30)
    one_line_error(res)
    assert "number of seconds, 0 or more" in res.stderr


def _wait_output(proc: subprocess.Popen[str], log: Path, needle: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = log.read_text()
        if needle in out:
            return out
        if proc.poll() is not None:
            raise AssertionError(out)
        time.sleep(0.1)
    raise AssertionError(log.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM])
def test_demo_keep_running_stopped_by_signal_leaves_nothing(tmp_path: Path, sig: int) -> None:
    log = tmp_path / "demo.log"
    with log.open("w") as f:
        proc = subprocess.Popen([EXE, "demo", "--rows", "3000", "--groups", "30", "--repeat",
                                 "1", "--keep-running"], stdout=f, stderr=f, text=True,
                                cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
    marker = None
    try:
        out = _wait_output(proc, log, "Ctrl-C to stop", 180)
        m = re.search(r"PostgreSQL: postgresql://postgres@127\.0\.0\.1:(\d+)/", out)
        assert m, out
        marker = f"port={m.group(1)}"
        assert server_pids(marker)
        proc.send_signal(sig)
        proc.wait(60)
        time.sleep(1)
        left = server_pids(marker)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if marker:
            dirs = set()
            for pid in server_pids(marker):
                with contextlib.suppress(OSError):
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    if b"-D" in cmd:
                        dirs.add(cmd[cmd.index(b"-D") + 1].decode())
            kill_postgres(marker)
            for d in dirs:
                if d.startswith("/tmp/imp-pg-"):
                    shutil.rmtree(Path(d).parent, ignore_errors=True)
    assert not left, (proc.returncode, left)


def test_upstream_hostaddr_is_used_as_libpq_uses_it(admin_dsn: str) -> None:
    """libpq connects to ``hostaddr`` and uses ``host`` only to authenticate: found, the
    relay looked ``host`` up instead (a name that does not resolve)."""
    port = psycopg.conninfo.conninfo_to_dict(admin_dsn)["port"]
    dsn = f"host=db.invalid hostaddr=127.0.0.1 port={port} user=postgres dbname=postgres"
    with psycopg.connect(dsn, connect_timeout=5) as c:  # libpq (psycopg) accepts it
        c.execute("SELECT 1")
    s = Serve("--listen", "127.0.0.1:0", "--upstream", dsn, "--no-sketches")
    try:
        assert_serves(s, 30)
    finally:
        s.stop()
