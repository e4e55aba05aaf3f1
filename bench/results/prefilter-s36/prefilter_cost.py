"""The relay's lexical gate before and after session 36 let comments precede the SELECT, side
by side in one process (interleaved repetitions, best of each): it runs on every SELECT the
relay sees while sketching is on.

Run: ``.venv/bin/python bench/results/prefilter-s36/prefilter_cost.py``
"""

from __future__ import annotations

import functools
import re
import timeit

from imp_proxy.router import prefilter

_BEFORE = re.compile(rb"\A\s*(?:select|with|\()", re.IGNORECASE)
_SHAPE = re.compile(rb"\b(?:group|order|having|limit|fetch|distinct)\b")


def before(sql: bytes) -> bool:
    """``router.prefilter`` as of session 35."""
    if not _BEFORE.match(sql):
        return False
    body = sql.rstrip().rstrip(b";")
    if b";" in body:
        return False
    return _SHAPE.search(body.lower()) is not None


TEXTS = {
    "pgbench -S": b"SELECT abalance FROM pgbench_accounts WHERE aid = 48213;",
    "HAVING query": b"SELECT g, sum(v) FROM t GROUP BY g HAVING sum(v) > 1000",
    "commented HAVING": b"/* report */ SELECT g, sum(v) FROM t GROUP BY g HAVING sum(v) > 1",
    "UPDATE": b"UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = 7;",
}


def main() -> None:
    n = 200_000
    print(f"best of 7 interleaved repetitions of {n:,} calls, ns per call")
    print("| text | before | after | after / before |")
    print("|---|---:|---:|---:|")
    for name, text in TEXTS.items():
        best = {"before": float("inf"), "after": float("inf")}
        for _ in range(7):
            for label, fn in (("before", before), ("after", prefilter)):
                t = timeit.timeit(functools.partial(fn, text), number=n) / n * 1e9
                best[label] = min(best[label], t)
        print(f"| {name} ({before(text)} → {prefilter(text)}) | {best['before']:.0f}"
              f" | {best['after']:.0f} | {best['after'] / best['before']:.2f} |")


if __name__ == "__main__":
    main()
