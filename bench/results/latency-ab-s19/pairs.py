"""Pairs the ``added p50`` figures of ``before-N.md`` and ``after-N.md`` in the current
directory (N = 1, 2, … while both exist) and prints the differences and their median per
scenario."""

from __future__ import annotations

import re
import statistics
from itertools import count
from pathlib import Path

_ROW = re.compile(r"\| (unchanged|after a write) \| (simple|extended) \| [\d.]+ \| [\d.]+ \|"
                  r" \+?(-?[\d.]+) \|")


def added(path: str) -> dict[tuple[str, str], float]:
    """(scenario, protocol) -> added p50 ms of one latency_bench report."""
    out: dict[tuple[str, str], float] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = _ROW.match(line)
            if m:
                out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def main() -> None:
    diffs: dict[tuple[str, str], list[float]] = {}
    for i in count(1):
        if not (Path(f"after-{i}.md").exists() and Path(f"before-{i}.md").exists()):
            break
        after, before = added(f"after-{i}.md"), added(f"before-{i}.md")
        for key, value in after.items():
            diffs.setdefault(key, []).append(round(value - before[key], 3))
    for key, values in diffs.items():
        print(key, values, "median", round(statistics.median(values), 3))


if __name__ == "__main__":
    main()
