#!/bin/bash
# A/B: session start (d6820b7, work tree /tmp/s14/before) vs this session's join plan change, alternating
OUT=$(cd "$(dirname "$0")" && pwd)
S="join-1n-1%,join-1n-5%,join-1n-10%,join-mn-1%,join-mn-5%,join-mn-10%"
for r in 1 2 3; do
  if [ $r = 2 ]; then order="new start"; else order="start new"; fi
  for v in $order; do
    if [ $v = start ]; then P=/tmp/s14/before; else P=/work/main; fi
    (cd $P && PYTHONPATH=$P /work/main/.venv/bin/python -m bench.maintenance_bench --scale full --shapes "$S" --deltas 10,50,100,500,1000 --fractions 0.01,0.1 --reps 5 --reps-large 1 --no-rebuild --out "$OUT" --stem $v-$r) > "$OUT/$v-$r.log" 2>&1
    echo "$v-$r rc=$? $(date +%T)"
  done
done
echo done
