"""Relay overhead: ``pgbench -S`` directly, through PgBouncer and through the IMP proxy.

``python -m bench.pgbench_bench [--scale 5] [--duration 10] [--out bench/results/pgbench.md]``

One run starts a throwaway PostgreSQL 15, initialises pgbench tables, starts PgBouncer
(session pooling, auth_type trust, run as the ``postgres`` user when root) and the proxy (as
subprocesses, stopped by PID), then runs ``pgbench -S`` for each target × protocol (simple,
extended) × clients (1, 8). It reports TPS, the TPS ratio to direct, and the latency added per
transaction at p50/p99 (from pgbench's per-transaction log).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import platform
import pwd
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from bench.machine import machine_facts, revision
from imp_proxy.embedded import LocalPostgres, free_port

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


TRANSPORTS = {"tcp": ("tcp",), "unix": ("unix",), "both": ("tcp", "unix")}
"""Upstream transports of the relays; clients (pgbench) always connect over TCP."""


class Target(NamedTuple):
    port: int
    relay_pid: int | None
    """The process relaying to PostgreSQL (None: pgbench talks to PostgreSQL directly)."""


class BenchError(RuntimeError):
    """A component of the benchmark could not be started or failed."""


@dataclass(frozen=True, slots=True)
class Result:
    target: str
    mode: str
    clients: int
    tps: float
    p50_ms: float
    p99_ms: float
    transactions: int
    relay_user_us: float = math.nan
    """CPU the relay process (PgBouncer, proxy) spent per transaction, user and kernel."""
    relay_sys_us: float = math.nan


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise BenchError(f"{what} not listening on {port} after {timeout}s")


def _stop(pid: int, proc: subprocess.Popen[bytes], sig: int = signal.SIGINT) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def pgbouncer(host: str, port: int, workdir: Path, mode: str = "session",
              pool_size: int = 50) -> Iterator[Target]:
    """PgBouncer (``pool_mode`` ``mode``, ``default_pool_size`` ``pool_size``, trust
    authentication) in front of the PostgreSQL at ``host`` (a name, an address or a Unix
    socket directory) and ``port``, its files in ``workdir`` (made here); yields its port and
    PID. Stopped by PID."""
    d = workdir
    d.mkdir(parents=True)
    listen = free_port()
    (d / "userlist.txt").write_text('"postgres" ""\n')
    (d / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={host} port={port}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {listen}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {d / 'userlist.txt'}\n"
        f"pool_mode = {mode}\nmax_client_conn = 200\ndefault_pool_size = {pool_size}\n"
        f"logfile = {d / 'pgbouncer.log'}\npidfile = {d / 'pgbouncer.pid'}\n"
        "ignore_startup_parameters = extra_float_digits\n")
    argv = [PGBOUNCER, str(d / "pgbouncer.ini")]
    if os.geteuid() == 0:  # pgbouncer refuses to run as root
        pw = pwd.getpwnam("postgres")
        for p in (d.parent, d, *d.iterdir()):
            os.chown(p, pw.pw_uid, pw.pw_gid)
        argv = ["runuser", "-u", "postgres", "--", *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        _wait_port(listen, proc, "pgbouncer")
        pid = int((d / "pgbouncer.pid").read_text().split()[0])
    except (BenchError, OSError, ValueError):
        _stop(proc.pid, proc, signal.SIGKILL)
        raise
    log.info("pgbouncer pid %d on port %d", pid, listen)
    try:
        yield Target(listen, pid)
    finally:
        _stop(pid, proc)


@contextlib.contextmanager
def imp_proxy(pg: LocalPostgres, workdir: Path, *extra: str,
              unix: bool = False) -> Iterator[Target]:
    """``python -m imp_proxy serve`` in front of ``pg`` (over its Unix socket when ``unix``,
    else TCP); yields its port and PID."""
    upstream = pg.socket_dsn() if unix else pg.dsn()
    port = free_port()
    logfile = workdir / f"imp-proxy-{port}.log"
    with open(logfile, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "imp_proxy", "--log-level", "WARNING", "serve",
             "--listen", f"127.0.0.1:{port}", "--upstream", upstream, *extra],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        _wait_port(port, proc, "imp-proxy")
    except BenchError:
        _stop(proc.pid, proc, signal.SIGKILL)
        raise BenchError(logfile.read_text(errors="replace")) from None
    try:
        yield Target(port, proc.pid)
    finally:
        _stop(proc.pid, proc, signal.SIGTERM)


def run_pgbench(port: int, mode: str, clients: int, duration: int,
                workdir: Path) -> tuple[float, list[float]]:
    """TPS and per-transaction latencies (ms) of one ``pgbench -S`` run."""
    logdir = Path(tempfile.mkdtemp(prefix="pgbench-log-", dir=workdir))
    argv = ["pgbench", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-n", "-S",
            "-M", mode, "-c", str(clients), "-j", str(min(clients, 2)), "-T", str(duration),
            "-l", "--log-prefix", str(logdir / "tx"), "postgres"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 120)
    if res.returncode != 0:
        raise BenchError(f"pgbench failed: {res.stderr.strip()}")
    m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", res.stdout)
    if m is None:
        raise BenchError(f"no TPS in pgbench output: {res.stdout}")
    latencies: list[float] = []
    for f in logdir.iterdir():
        for line in f.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3:
                latencies.append(int(parts[2]) / 1000.0)
    shutil.rmtree(logdir, ignore_errors=True)
    return float(m.group(1)), latencies


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """User and kernel CPU seconds of process ``pid`` so far, all threads (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _transport(target: str) -> str:
    """The upstream transport in a target's name (``"pgbouncer (unix)"`` → ``"unix"``)."""
    return target.rpartition("(")[2].rstrip(")")


def _cpu_cell(r: Result) -> str:
    if math.isnan(r.relay_user_us):
        return "–"
    return (f"{r.relay_user_us + r.relay_sys_us:.1f} ({r.relay_user_us:.1f} + "
            f"{r.relay_sys_us:.1f})")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def measure(targets: dict[str, Target], duration: int, reps: int,
            workdir: Path) -> list[Result]:
    """Every (protocol, clients) configuration on every target, interleaved target by target
    and repeated ``reps`` times; per target the run with the median TPS is kept. Interleaving
    spreads the machine's background load evenly over the targets."""
    out = []
    for mode in ("simple", "extended"):
        for clients in (1, 8):
            runs: dict[str, list[Result]] = {t: [] for t in targets}
            for rep in range(reps):
                for target, (port, pid) in targets.items():
                    before = _cpu_seconds(pid) if pid is not None else None
                    tps, lat = run_pgbench(port, mode, clients, duration, workdir)
                    cpu = (math.nan, math.nan)
                    if pid is not None and before is not None:
                        (user, sys_), n = _cpu_seconds(pid), max(len(lat), 1)
                        cpu = ((user - before[0]) / n * 1e6, (sys_ - before[1]) / n * 1e6)
                    r = Result(target, mode, clients, tps, percentile(lat, 50),
                               percentile(lat, 99), len(lat), *cpu)
                    log.info("rep %d %-24s %-8s c=%d tps=%9.0f p50=%.3fms p99=%.3fms", rep,
                             target, mode, clients, tps, r.p50_ms, r.p99_ms)
                    runs[target].append(r)
            for target in targets:
                ordered = sorted(runs[target], key=lambda r: r.tps)
                out.append(ordered[len(ordered) // 2])
    order = list(targets)
    return sorted(out, key=lambda r: (order.index(r.target), r.mode != "simple", r.clients))


def report(results: list[Result], argv: list[str], scale: int, duration: int, reps: int,
           load: tuple[tuple[float, float, float], tuple[float, float, float]]) -> str:
    direct = {(r.mode, r.clients): r for r in results if r.target == "direct"}
    lines = [
        "# pgbench -S: direct vs PgBouncer vs IMP proxy",
        "",
        f"Command: `{' '.join(argv)}` at git {revision(machine_facts())}  ",
        f"Machine: {platform.node()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; PostgreSQL 15 (throwaway cluster, fsync off), "
        f"pgbench scale {scale}, {duration} s per run, {reps} interleaved runs per "
        "configuration (median-TPS run shown), "
        "`pgbench -S -M <mode> -c <clients> -j min(clients,2)`. PgBouncer session "
        "pooling. pgbench always connects over TCP; the target name says how PgBouncer or "
        "the proxy reaches PostgreSQL (TCP on 127.0.0.1 or its Unix socket). "
        "All processes share the same 2 cores, so relay CPU competes with "
        "PostgreSQL and pgbench; the machine is shared with other work "
        f"(load average {load[0][0]:.1f} before, {load[1][0]:.1f} after).",
        "",
        "| target | protocol | clients | TPS | ratio vs direct | p50 ms | p99 ms "
        "| added p50 ms | added p99 ms | relay CPU µs/txn (user + kernel) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        d = direct[(r.mode, r.clients)]
        lines.append(
            f"| {r.target} | {r.mode} | {r.clients} | {r.tps:,.0f} | {r.tps / d.tps:.2f} "
            f"| {r.p50_ms:.3f} | {r.p99_ms:.3f} | {r.p50_ms - d.p50_ms:+.3f} "
            f"| {r.p99_ms - d.p99_ms:+.3f} | {_cpu_cell(r)} |")
    bouncer = {(_transport(r.target), r.mode, r.clients): r
               for r in results if r.target.startswith("pgbouncer")}
    if bouncer:
        lines += ["", "Overhead relative to PgBouncer with the same upstream transport (added "
                  "p50 latency per transaction, proxy / pgbouncer):", ""]
    goals = []
    for r in results:
        if not r.target.startswith("imp-proxy"):
            continue
        d = direct[(r.mode, r.clients)]
        b = bouncer.get((_transport(r.target), r.mode, r.clients))
        ratio = float("nan")
        if b is not None:
            added_b = b.p50_ms - d.p50_ms
            ratio = (r.p50_ms - d.p50_ms) / added_b if added_b > 0 else float("nan")
            lines.append(f"* {r.target}, {r.mode}, {r.clients} clients: "
                         f"{r.p50_ms - d.p50_ms:+.3f} ms vs {added_b:+.3f} ms → {ratio:.2f}×")
        if r.clients == 8:
            met = r.tps / d.tps >= 0.5 and (b is None or ratio <= 2.0)
            goals.append(f"| {r.target} | {r.mode} | {r.tps / d.tps:.2f} | {ratio:.2f}× "
                         f"| {'met' if met else 'missed'} |")
    if goals:
        lines += ["", "Goal at 8 clients: ≥ 0.50 of direct TPS and added p50 latency within 2× "
                  "of PgBouncer's:", "",
                  "| target | protocol | TPS vs direct | overhead vs PgBouncer | goal |",
                  "|---|---|---:|---:|---|", *goals]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--scale", type=int, default=5, help="pgbench scale factor (default 5)")
    parser.add_argument("--duration", type=int, default=10,
                        help="seconds per configuration (default 10)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "pgbench.md",
                        help="markdown report to write")
    parser.add_argument("--reps", type=int, default=3,
                        help="repetitions per configuration; the median-TPS run is reported")
    parser.add_argument("--skip-pgbouncer", action="store_true")
    parser.add_argument("--upstream", choices=sorted(TRANSPORTS), default="both",
                        help="how PgBouncer and the proxy reach PostgreSQL: TCP on 127.0.0.1, "
                        "its Unix socket, or both side by side (default)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    cmdline = ["python", "-m", "bench.pgbench_bench", *(argv if argv is not None else sys.argv[1:])]
    workdir = Path(tempfile.mkdtemp(prefix="imp-pgbench-"))
    load_before = os.getloadavg()
    try:
        with LocalPostgres.throwaway_cluster() as pg, contextlib.ExitStack() as stack:
            subprocess.run(["pgbench", "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres",
                            "-i", "-q", "-s", str(args.scale), "postgres"], check=True,
                           capture_output=True)
            targets = {"direct": Target(pg.port, None)}
            for transport in TRANSPORTS[args.upstream]:
                unix = transport == "unix"
                if not args.skip_pgbouncer:
                    targets[f"pgbouncer ({transport})"] = stack.enter_context(
                        pgbouncer(str(pg.socket_dir) if unix else "127.0.0.1", pg.port,
                                  workdir / f"pgbouncer-{transport}"))
                targets[f"imp-proxy relay only ({transport})"] = stack.enter_context(
                    imp_proxy(pg, workdir, "--no-sketches", unix=unix))
                targets[f"imp-proxy sketches on ({transport})"] = stack.enter_context(
                    imp_proxy(pg, workdir, unix=unix))
            results = measure(targets, args.duration, args.reps, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    load = (load_before, os.getloadavg())
    text = report(results, cmdline, args.scale, args.duration, args.reps, load)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
