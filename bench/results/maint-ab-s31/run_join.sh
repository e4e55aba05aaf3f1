#!/bin/bash
# join-only maintenance A/B: before/ and after/ are git worktrees of the two commits
WORK=${WORK:-/tmp/s31ab}
OUT=$WORK/join
mkdir -p $OUT
run() { (cd $WORK/$1 && PYTHONPATH=$WORK/$1 /work/main/.venv/bin/python -m bench.maintenance_bench \
    --scale full --shapes join-1n-5% --deltas 10,100,1000 \
    --fractions none --reps 15 --no-rebuild --out $OUT --stem $1-$2 > $OUT/$1-$2.log 2>&1); }
for i in 1 2; do
  if [ $((i % 2)) = 1 ]; then run before $i; run after $i; else run after $i; run before $i; fi
  echo "pair $i done $(date)" >> $OUT/progress
done
touch $OUT/done
