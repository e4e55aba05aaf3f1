#!/bin/bash
# maintenance A/B: before/ and after/ are git worktrees of the two commits
# (SHAPES, REPS and OUT default to what session 20 ran; session 31 set them for a join-only pair)
WORK=${WORK:-/tmp/s20ab}
OUT=${OUT:-$WORK/maint}
SHAPES=${SHAPES:-groups-5K,aggs-2,join-1n-5%,topk-rows}
REPS=${REPS:-5}
mkdir -p $OUT
run() { (cd $WORK/$1 && PYTHONPATH=$WORK/$1 /work/main/.venv/bin/python -m bench.maintenance_bench \
    --scale full --shapes $SHAPES --deltas 10,100,1000 \
    --fractions none --reps $REPS --no-rebuild --out $OUT --stem $1-$2 > $OUT/$1-$2.log 2>&1); }
for i in 1 2; do
  if [ $((i % 2)) = 1 ]; then run before $i; run after $i; else run after $i; run before $i; fi
  echo "pair $i done $(date)" >> $OUT/progress
done
touch $OUT/done
