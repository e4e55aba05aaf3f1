#!/bin/bash
# A/B: session start (dd2384c, /tmp/base) vs this session's HEAD, alternating, same command
OUT=$(cd "$(dirname "$0")" && pwd)
S="groups-1K,groups-5K,aggs-2,aggs-3,aggs-10,frags-5000,topk-groups,join-1n-1%,join-mn-1%"
for r in 1 2; do for v in start new; do
  if [ $v = start ]; then P=/tmp/base; else P=/work/main; fi
  (cd $P && PYTHONPATH=$P /work/main/.venv/bin/python -m bench.maintenance_bench --scale full --shapes "$S" --deltas 10,100,1000 --fractions none --reps 7 --no-rebuild --out "$OUT" --stem $v-$r) > "$OUT/$v-$r.log" 2>&1
done; done
echo done
