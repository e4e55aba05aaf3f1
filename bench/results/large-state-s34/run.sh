#!/bin/bash
# BEFORE, AFTER: two work trees (each with .venv); WORK: an output directory. Alternates before, after, after, before.
HERE=$(cd "$(dirname "$0")" && pwd); cd "$WORK"
for side in before after after before; do
  if [ $side = before ]; then T=$BEFORE; else T=$AFTER; fi
  (cd $T && PYTHONPATH=$T timeout 900 .venv/bin/python $HERE/inproc.py 1000000) >> $WORK/$side.jsonl 2>> $WORK/err.log
  echo "$side done $(date +%T)"
done
