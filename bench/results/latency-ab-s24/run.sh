#!/bin/bash
WORK=${WORK:-/tmp/s24ab}   # before/ and after/: git worktrees of the two commits
OUT=$WORK/lat
run() { (cd $WORK/$1 && PYTHONPATH=$WORK/$1 /work/main/.venv/bin/python -m bench.latency_bench --blocks 6 --out $OUT/$1-$2.md > $OUT/$1-$2.log 2>&1); }
for i in 1 2 3 4; do
  if [ $((i % 2)) = 1 ]; then run before $i; run after $i; else run after $i; run before $i; fi
  echo "pair $i done $(date)" >> $OUT/progress
done
touch $OUT/done
