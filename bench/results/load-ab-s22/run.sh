#!/bin/bash
# load_bench A/B: before = /tmp/s22/base, after = /tmp/s22/after; proxy DEBUG logs kept per run
OUT=/tmp/s22/lb
run() { mkdir -p $OUT/$1-$2; (cd /tmp/s22/$1 && IMP_PROXY_LOG_DIR=$OUT/$1-$2 PYTHONPATH=/tmp/s22/$1 /work/main/.venv/bin/python -m bench.load_bench \
    --clients 6 --seconds 90 --check-every 30 --rows 100000 --proxy-log-level DEBUG --out $OUT/$1-$2.md > $OUT/$1-$2.log 2>&1); }
for i in 1 2; do
  if [ $((i % 2)) = 1 ]; then run base $i; run after $i; else run after $i; run base $i; fi
  echo "pair $i done $(date)" >> $OUT/progress
done
touch $OUT/done
