#!/bin/bash
# large-state A/B: before/ and after/ are git worktrees of the two commits (before/ gets this
# commit's bench/large_state_bench.py copied in); runs before, after, after, before.
WORK=${WORK:-/tmp/s27ab}
OUT=${OUT:-$WORK/out}
mkdir -p "$OUT"
run() { (cd "$WORK/$1" && PYTHONPATH="$WORK/$1" /work/main/.venv/bin/python -m bench.large_state_bench \
    --out "$OUT/$1-$2.md" > "$OUT/$1-$2.log" 2>&1); }
run before 1; run after 1; run after 2; run before 2
touch "$OUT/done"
