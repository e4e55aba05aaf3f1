"""bench.large_state_bench's in-process part alone (build, snapshot, save, reload): one JSON
line of ``[seconds, longest stall in ms]`` per phase."""

import json
import sys

from bench import large_state_bench as lsb
from imp_proxy.embedded import given_or_throwaway as cluster

rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
with cluster(None) as dsn:
    lsb._load(dsn, rows)
    out = lsb.in_process(dsn)
print(json.dumps({k: [round(v[0], 2), round(v[1] * 1e3)] for k, v in out.items()}))
