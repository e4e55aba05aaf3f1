"""Facts about the machine and the code a result was measured on."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def _git(*args: str) -> str:
    try:
        res = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent.parent)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return res.stdout.strip() if res.returncode == 0 else ""


def _meminfo_total() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def command_line() -> str:
    """The exact command as it was typed, as far as the interpreter knows it."""
    argv = list(sys.orig_argv) if hasattr(sys, "orig_argv") else [sys.executable, *sys.argv]
    return shlex.join(argv)


def revision(facts: dict[str, Any]) -> str:
    """``facts``' git commit, short, marked ``(dirty)`` when tracked files had changes."""
    return f"{str(facts['git_commit'])[:12]}{' (dirty)' if facts.get('git_dirty') else ''}"


def machine_facts(pg_version: str = "") -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "timestamp_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command_line(),
        "cwd": os.getcwd(),
        "hostname": platform.node(),
        "nproc": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": _cpu_model(),
        "memory_bytes": _meminfo_total(),
        "loadavg_at_start": list(load),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "postgresql": pg_version,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_branch": _git("rev-parse", "--abbrev-ref", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }
