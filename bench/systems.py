"""The systems under test, reached over the wire with psycopg like any application.

* NS: a connection straight to PostgreSQL.
* FM / IMP-lazy / IMP-eager-<batch>: a connection to an ``imp-proxy serve`` subprocess started by
  the harness (one per run, so each run starts without sketches), configured with the proxy's
  admin statements (``IMP SET …``) on that connection, and stopped by PID.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench.config import SystemSpec
from imp_proxy.embedded import free_port

log = logging.getLogger(__name__)

Conn = psycopg.Connection[tuple[Any, ...]]


REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class ProxyLauncher:
    """How to start ``imp-proxy serve``: the argv before ``serve`` and the code it runs.

    ``code_dir`` leads the child's PYTHONPATH (and is its cwd), so the proxy runs exactly that
    code — a pinned ``git archive`` of a commit (the default: results are reproducible at a
    recorded commit, whatever is being edited in the working tree meanwhile) or the working
    tree itself.
    """

    argv: tuple[str, ...]
    code_dir: Path
    label: str

    @classmethod
    def from_config(cls, proxy_bin: str | None, proxy_code: str, scratch: Path) -> ProxyLauncher:
        if proxy_bin:
            return cls((proxy_bin,), REPO_ROOT, f"binary {proxy_bin} (working tree)")
        module = (sys.executable, "-m", "imp_proxy")
        if proxy_code == "worktree":
            return cls(module, REPO_ROOT, "working tree")
        sha = subprocess.run(["git", "rev-parse", "--verify", f"{proxy_code}^{{commit}}"],
                             cwd=REPO_ROOT, capture_output=True, text=True, check=True
                             ).stdout.strip()
        dest = scratch / f"imp-code-{sha[:12]}"
        if not (dest / ".complete").exists():
            dest.mkdir(parents=True, exist_ok=True)
            archive = subprocess.run(["git", "archive", sha], cwd=REPO_ROOT,
                                     capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
            (dest / ".complete").write_text(sha + "\n")
        return cls(module, dest, f"git {sha}")

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.code_dir),
                                                        env.get("PYTHONPATH")) if p)
        return env


class ProxyError(RuntimeError):
    """The proxy could not be started, configured or reached."""


#: admin statements tried in order for FM; the first the proxy accepts wins
FM_STATEMENTS = ("IMP SET strategy = recapture", "IMP SET strategy = full")
#: eager runs isolate the batch-size trigger (IMP paper Fig. 16): the time trigger is pushed out
EAGER_INTERVAL_S = 3600
_REJECTED = (psycopg.errors.UndefinedObject, psycopg.errors.InvalidParameterValue,
             psycopg.errors.SyntaxError, psycopg.errors.InvalidTextRepresentation)


def admin_statements(spec: SystemSpec) -> list[tuple[str, bool]]:
    """(statement, required) that put the proxy into the incremental strategy of ``spec``."""
    if spec.kind == "lazy":
        return [("IMP SET strategy = lazy", True)]
    if spec.kind == "eager":
        return [("IMP SET strategy = eager", True),
                (f"IMP SET batch_size = {int(spec.batch or 1)}", True),
                (f"IMP SET batch_interval = {EAGER_INTERVAL_S}", False)]
    return []


def configure(conn: Conn, spec: SystemSpec) -> str:
    """Puts the proxy behind ``conn`` into ``spec``'s strategy; returns how (for the record).

    Full maintenance = a stale sketch is recaptured from scratch (``IMP SET strategy =
    recapture``). A proxy without that setting qualifies only if ``IMP SHOW STATS`` says its
    maintenance is recapture-on-change; whenever the proxy reports its ``strategy``, it must be
    the one asked for — otherwise the run fails rather than measure the wrong thing.
    """
    done: list[str] = []
    if spec.kind == "fm":
        for stmt in FM_STATEMENTS:
            try:
                execute(conn, stmt)
                done.append(stmt)
                break
            except _REJECTED:
                continue
        stats = show_stats(conn)
        if not done:
            maint = str(stats.get("maintenance", ""))
            if "recapture" not in maint or "strategy" in stats:
                raise ProxyError(f"the proxy offers no full-maintenance setting (maintenance "
                                 f"{maint!r}, strategy {stats.get('strategy')!r})")
            done.append(f"default maintenance {maint}")
        want = "recapture"
    else:
        for stmt, required in admin_statements(spec):
            try:
                execute(conn, stmt)
                done.append(stmt)
            except _REJECTED:
                if required:
                    raise
                log.info("%s: optional setting refused: %s", spec.name, stmt)
        stats = show_stats(conn)
        want = spec.kind
    got = stats.get("strategy")
    if got is not None and str(got).lower() not in (want, "full"):
        raise ProxyError(f"asked for strategy {want!r}, the proxy reports {got!r}")
    return "; ".join(done)


def execute(conn: Conn, text: str) -> psycopg.Cursor[tuple[Any, ...]]:
    """Runs pre-rendered SQL text without parameters (simple query protocol)."""
    return conn.execute(text)


def show_sketches(conn: Conn) -> list[dict[str, Any]]:
    """Rows of ``IMP SHOW SKETCHES`` as dicts (column names from the row description)."""
    cur = conn.execute("IMP SHOW SKETCHES")
    names = [d.name for d in cur.description or []]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def show_stats(conn: Conn) -> dict[str, Any]:
    """``IMP SHOW STATS`` (key/value rows) as a dict."""
    return {str(k): v for k, v in conn.execute("IMP SHOW STATS").fetchall()}


@dataclass
class ProxyProcess:
    """``imp-proxy serve --listen 127.0.0.1:<port> --upstream <dsn>`` as a child process."""

    launcher: ProxyLauncher
    upstream: str
    log_path: Path
    extra_args: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    pid: int | None = None
    _proc: subprocess.Popen[bytes] | None = None

    def dsn(self, upstream_dsn: str) -> str:
        """The client DSN for the proxy: the upstream's user/database, the proxy's address."""
        params = psycopg.conninfo.conninfo_to_dict(upstream_dsn)
        params.update(host="127.0.0.1", port=str(self.port))
        params.pop("hostaddr", None)
        return psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]

    def start(self, timeout: float = 30.0) -> None:
        argv = [*self.launcher.argv, "serve", "--listen", f"127.0.0.1:{self.port}",
                "--upstream", self.upstream, *self.extra_args]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logfile = open(self.log_path, "ab")  # noqa: SIM115 — handed to the child
        try:
            self._proc = subprocess.Popen(argv, stdout=logfile, stderr=subprocess.STDOUT,
                                          start_new_session=True,
                                          env=self.launcher.env(),
                                          cwd=self.launcher.code_dir)
        finally:
            logfile.close()
        self.pid = self._proc.pid
        log.info("proxy pid %d on port %d: %s", self.pid, self.port, " ".join(argv))
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise ProxyError(f"proxy exited with {self._proc.returncode}: {self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise ProxyError(f"proxy not listening after {timeout}s: {self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM by PID, then SIGKILL if it does not exit in time."""
        if self._proc is None or self.pid is None:
            return
        if self._proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.warning("proxy pid %d ignored SIGTERM; killing", self.pid)
                os.kill(self.pid, signal.SIGKILL)
                self._proc.wait()
            except ProcessLookupError:
                pass
        self.pid = None
        self._proc = None


@dataclass
class Endpoint:
    """What a run talks to: the system's connection and, for proxied systems, a direct one."""

    spec: SystemSpec
    conn: Conn
    direct: Conn
    proxy: ProxyProcess | None = None
    configured: str = ""

    def sketches(self) -> list[dict[str, Any]]:
        if self.proxy is None:
            return []
        return show_sketches(self.conn)

    def stats(self) -> dict[str, Any]:
        if self.proxy is None:
            return {}
        return show_stats(self.conn)


@contextmanager
def open_endpoint(spec: SystemSpec, db_dsn: str, launcher: ProxyLauncher, log_path: Path,
                  proxy_args: tuple[str, ...] = ()) -> Iterator[Endpoint]:
    """Connections for one run of ``spec`` against database ``db_dsn``; starts/stops the proxy."""
    direct = psycopg.connect(db_dsn, autocommit=True)
    proxy: ProxyProcess | None = None
    try:
        if not spec.via_proxy:
            yield Endpoint(spec, direct, direct)
            return
        proxy = ProxyProcess(launcher, db_dsn, log_path, proxy_args)
        proxy.start()
        conn = _connect_retry(proxy.dsn(db_dsn))
        try:
            how = configure(conn, spec)
            log.info("%s configured: %s", spec.name, how)
            yield Endpoint(spec, conn, direct, proxy, how)
        finally:
            conn.close()
    finally:
        direct.close()
        if proxy is not None:
            proxy.stop()


def _connect_retry(dsn: str, timeout: float = 15.0) -> Conn:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return psycopg.connect(dsn, autocommit=True, connect_timeout=5)
        except psycopg.OperationalError as exc:
            if time.monotonic() > deadline:
                raise ProxyError(f"cannot connect through the proxy: {exc}") from exc
            time.sleep(0.1)
