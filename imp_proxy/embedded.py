"""A local PostgreSQL 15 cluster owned by this process: throwaway (tests, demo) or persistent
(the proxy's embedded default when no upstream DSN is configured).

Why here: the demo, the proxy's no-DSN default and the test fixtures all need the same thing,
an initdb'd cluster on a free port with its socket in its own directory, started and always
stopped by PID. ``initdb`` and ``postgres`` refuse to run as root, so as root the server runs as
the ``postgres`` user via ``runuser``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

PG_BIN = Path(os.environ.get("IMP_PG_BIN", "/usr/lib/postgresql/15/bin"))
_SOCKET_PATH_MAX = 107
"""The longest Unix socket path PostgreSQL accepts (``sun_path`` less its NUL, on Linux)."""


class EmbeddedPostgresError(RuntimeError):
    """The local cluster could not be initialised, started or reached."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_server_user(argv: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


def _chown_to_server_user(path: Path) -> None:
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(path, pw.pw_uid, pw.pw_gid)


@dataclass
class LocalPostgres:
    """One cluster in ``datadir``; ``start()`` / ``stop()``; ``dsn()`` for a superuser DSN.

    ``settings`` are passed as ``-c name=value`` to the server; ``hba`` replaces pg_hba.conf
    (default: trust on the loopback and the socket). The superuser is ``postgres``.
    """

    datadir: Path
    port: int = field(default_factory=free_port)
    settings: dict[str, str] = field(default_factory=dict)
    hba: str | None = None
    throwaway: bool = True
    pid: int | None = None
    _proc: subprocess.Popen[bytes] | None = None
    _spawning: bool = False   # start() reached its Popen (which a signal may interrupt)

    @classmethod
    def throwaway_cluster(cls, **kwargs: object) -> LocalPostgres:
        base = Path(tempfile.mkdtemp(prefix="imp-pg-", dir="/tmp"))
        _chown_to_server_user(base)
        return cls(datadir=base / "data", throwaway=True, **kwargs)  # type: ignore[arg-type]

    @property
    def socket_dir(self) -> Path:
        """``sock`` next to the data directory; when a socket there would exceed
        :data:`_SOCKET_PATH_MAX` (a deep data directory), a directory in the temporary
        directory named for the data directory's path, so the same cluster finds it again."""
        own = self.datadir.parent / "sock"
        if len(os.fsencode(own / ".s.PGSQL.65535")) <= _SOCKET_PATH_MAX:
            return own
        digest = hashlib.sha256(os.fsencode(self.datadir.absolute())).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"imp-sock-{digest}"

    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def socket_dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        """The DSN over the cluster's Unix socket: a relay on this machine spends less kernel
        time per message on it than on TCP loopback (``bench/results/pgbench.md``)."""
        host = urllib.parse.quote(str(self.socket_dir), safe="/")   # a space, %, # or &
        return f"postgresql://{user}@/{dbname}?host={host}&port={self.port}"

    def initdb(self) -> None:
        if (self.datadir / "PG_VERSION").exists():
            return
        self.datadir.parent.mkdir(parents=True, exist_ok=True)
        _chown_to_server_user(self.datadir.parent)
        cmd = [str(PG_BIN / "initdb"), "-D", str(self.datadir), "-U", "postgres",
               "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"]
        res = subprocess.run(_as_server_user(cmd), capture_output=True, text=True)
        if res.returncode != 0:
            raise EmbeddedPostgresError(f"initdb failed: {res.stderr.strip()}")
        if self.hba is not None:
            (self.datadir / "pg_hba.conf").write_text(self.hba)

    def start(self, timeout: float = 30.0) -> None:
        self.initdb()
        self._make_socket_dir()
        opts = {
            "port": str(self.port), "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.socket_dir), "fsync": "off",
            "synchronous_commit": "off", "full_page_writes": "off", "max_connections": "200",
            "shared_buffers": "256MB", "logging_collector": "off",
        }
        opts.update(self.settings)
        argv = [str(PG_BIN / "postgres"), "-D", str(self.datadir)]
        for k, v in opts.items():
            argv += ["-c", f"{k}={v}"]
        logfile = open(self.datadir.parent / "server.log", "ab")  # noqa: SIM115
        self._spawning = True
        self._proc = subprocess.Popen(_as_server_user(argv), stdout=logfile, stderr=logfile,
                                      start_new_session=True)
        logfile.close()
        self._wait_ready(timeout)
        self.pid = self._server_pid()

    def _make_socket_dir(self) -> None:
        """Creates :attr:`socket_dir` for the server user; one found that is a symbolic link
        or belongs to another user is refused (the fallback sits in a shared directory)."""
        path = self.socket_dir
        path.mkdir(parents=True, exist_ok=True)
        st = path.lstat()
        owners = {os.geteuid()}
        if os.geteuid() == 0:
            owners.add(pwd.getpwnam("postgres").pw_uid)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in owners:
            raise EmbeddedPostgresError(f"socket directory {path} is not a directory of "
                                        "this user's or of the server's")
        _chown_to_server_user(path)

    def _spawned_pid(self, timeout: float = 5.0) -> int | None:
        """The PID of the postmaster :meth:`start` spawned, once it wrote ``postmaster.pid``
        (a start interrupted at once may not have yet; a signal inside ``Popen`` may even
        leave no ``_proc``: found, a cluster left running now and then); None when it exited
        first or wrote nothing in ``timeout``."""
        deadline = time.monotonic() + timeout
        while (self._proc is None or self._proc.poll() is None) \
                and time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, IndexError):
                return self._server_pid()
            time.sleep(0.05)
        return None

    def _server_pid(self) -> int:
        first = (self.datadir / "postmaster.pid").read_text().splitlines()[0]
        return int(first)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise EmbeddedPostgresError(f"postgres exited: {self.log_tail()}")
            res = subprocess.run([str(PG_BIN / "pg_isready"), "-h", "127.0.0.1", "-p",
                                  str(self.port), "-U", "postgres"], capture_output=True)
            if res.returncode == 0 and (self.datadir / "postmaster.pid").exists():
                return
            time.sleep(0.05)
        raise EmbeddedPostgresError(f"postgres not ready after {timeout}s: {self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = (self.datadir.parent / "server.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, mode: str = "fast") -> None:
        """Stops the postmaster by PID (SIGINT = fast shutdown) and waits for it; also one
        this object spawned that never became ready (its PID from ``postmaster.pid``)."""
        sig = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}[mode]
        pid = self.pid if self.pid is not None or not self._spawning else self._spawned_pid()
        if pid is not None:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if self._proc is not None:
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        elif pid is not None:   # not our child (taken over): wait until it is gone
            deadline = time.monotonic() + 30
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        self.pid = None
        self._proc = None
        self._spawning = False

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def destroy(self) -> None:
        self.stop()
        if self.throwaway:
            shutil.rmtree(self.datadir.parent, ignore_errors=True)
            shutil.rmtree(self.socket_dir, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        try:
            self.start()
        except BaseException:   # a start that failed or was interrupted leaves nothing
            self.destroy()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def given_or_throwaway(dsn: str | None) -> Iterator[str]:
    """``dsn`` when one is given, else the superuser DSN of a throwaway cluster that lives
    exactly as long as the ``with`` block (the demo's and the benchmarks' embedded default)."""
    if dsn:
        yield dsn
        return
    with LocalPostgres.throwaway_cluster() as pg:
        yield pg.dsn()
