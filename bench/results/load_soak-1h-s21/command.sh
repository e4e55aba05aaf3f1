#!/bin/bash
# 1-hour soak: bench.load_bench (commit in /tmp/soak/src.commit, exported to /tmp/soak/src) via the observer wrapper
cd /tmp/soak/src
export SOAK_SRC=/tmp/soak/src PYTHONPATH=/tmp/soak/src SOAK_THINK=0.025 \
       IMP_PROXY_LOG_DIR=/tmp/soak/run1h SOAK_MISMATCH_LOG=/tmp/soak/run1h/mismatches.jsonl
exec /work/main/.venv/bin/python /tmp/soak/soak.py \
  --csv /tmp/soak/run1h/samples.csv --stats-jsonl /tmp/soak/run1h/samples.jsonl --sample 30 -- \
  --clients 6 --direct-writers 2 --seconds 3600 --check-every 20 \
  --upstream postgresql://postgres@127.0.0.1:55432/postgres --out /tmp/soak/run1h/load_bench_report.md
