"""``imp-proxy serve`` as a subprocess of this checkout, for benchmarks and tests.

Why a subprocess: the proxy runs exactly as a user runs it, and psycopg's ``cancel()`` holds the
GIL, which froze an in-process proxy. The proxy listens on port 0; its port is read from its
log. It is always stopped by PID.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
_LISTENING = re.compile(r"imp-proxy listening on [^\s]+:(\d+)")


@dataclass
class ProxyProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def launch_proxy(upstream: str | None, *args: str, log_level: str = "INFO",
                 timeout: float = 60.0) -> ProxyProcess:
    """Starts ``python -m imp_proxy serve`` on a free port and waits until it listens
    (``upstream=None``: the proxy's embedded PostgreSQL). Its log goes to a new file in
    ``$IMP_PROXY_LOG_DIR`` (the test suite points it at pytest's temporary directory, which
    keeps the last three runs), else in the system's temporary directory."""
    up = ["--upstream", upstream] if upstream is not None else []
    log = Path(tempfile.mkstemp(prefix="imp-proxy-", suffix=".log",
                                dir=os.environ.get("IMP_PROXY_LOG_DIR"))[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "imp_proxy", "--log-level", log_level, "serve",
             "--listen", "127.0.0.1:0", *up, *args],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = _LISTENING.search(log.read_text(errors="replace"))
        if m:
            return ProxyProcess(proc, int(m.group(1)), log)
        if proc.poll() is not None:
            raise RuntimeError(f"proxy exited with {proc.returncode}: {log.read_text()}")
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"proxy did not start within {timeout}s: {log.read_text()}")


@contextmanager
def proxied(upstream: str, *args: str) -> Iterator[str]:
    """A DSN of this checkout's proxy (``launch_proxy``, ``args`` added, logging warnings)
    in front of ``upstream``; the proxy is stopped on exit."""
    proxy = launch_proxy(upstream, *args, log_level="WARNING")
    try:
        yield psycopg.conninfo.make_conninfo(upstream, host="127.0.0.1", port=proxy.port)
    finally:
        proxy.stop()
