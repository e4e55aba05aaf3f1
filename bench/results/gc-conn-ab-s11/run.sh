#!/bin/bash
# A/B of the benchmark's GC method: a connection per call (449640d, /tmp/base2) vs one
# long-lived collector connection (1fe8f03); same engine code; alternating, two rounds
OUT=$(cd "$(dirname "$0")" && pwd)
S="groups-1K,groups-5K,aggs-2,frags-100,topk-groups,join-1n-5%,join-mn-5%"
for r in 1 2; do for v in per-call long-lived; do
  if [ $v = per-call ]; then P=/tmp/base2; else P=/work/main; fi
  (cd $P && PYTHONPATH=$P /work/main/.venv/bin/python -m bench.maintenance_bench --scale full --shapes "$S" --deltas 10,50,100,1000 --fractions none --reps 7 --no-rebuild --out "$OUT" --stem $v-$r) > "$OUT/$v-$r.log" 2>&1
done; done
echo done
