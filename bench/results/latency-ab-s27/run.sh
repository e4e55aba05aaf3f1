#!/bin/bash
WORK=/tmp/s27ab
OUT=$WORK/lat
run() { (cd $WORK/$1 && PYTHONPATH=$WORK/$1 /work/main/.venv/bin/python -m bench.latency_bench --blocks 6 --out $OUT/$1-$2.md > $OUT/$1-$2.log 2>&1); }
for i in ${PAIRS:-1 2}; do
  if [ $((i % 2)) = 1 ]; then run before $i; run after $i; else run after $i; run before $i; fi
  echo "pair $i done $(date)" >> $OUT/progress
done
touch $OUT/done
