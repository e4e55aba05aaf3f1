"""Summarises an A/B of maintenance_bench CSVs: per shape and delta size, the median IMP time
and the median per-repetition ratio recapture / IMP of every side and round.

Usage: summarise.py DIR SIDES ROUNDS (e.g. ``. start,new 1,2`` reads ``start-1.csv`` …)."""

from __future__ import annotations

import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def main(folder: Path, sides: list[str], rounds: list[str]) -> None:
    times: defaultdict[tuple[str, str, tuple[str, int]], list[tuple[float, float]]] = \
        defaultdict(list)
    order: list[tuple[str, int]] = []
    for side in sides:
        for r in rounds:
            with open(folder / f"{side}-{r}.csv", newline="") as f:
                for row in csv.DictReader(f):
                    key = (row["shape"], int(row["delta_rows"]))
                    if key not in order:
                        order.append(key)
                    times[side, r, key].append((float(row["imp_ms"]),
                                                float(row["recapture_ms"])))
    print("| shape | delta rows | "
          + " | ".join(f"{s} round {r}" for r in rounds for s in sides) + " |")
    print("|---|---:|" + "---:|" * (len(sides) * len(rounds)))
    for key in order:
        cells = []
        for r in rounds:
            for s in sides:
                pairs = times[s, r, key]
                imp = statistics.median(i for i, _ in pairs)
                ratio = statistics.median(c / i for i, c in pairs)
                cells.append(f"{imp:.2f} ms ({ratio:.0f}×)")
        print(f"| {key[0]} | {key[1]:,} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2].split(","), sys.argv[3].split(","))
