#!/usr/bin/env bash
# The whole test suite: installs what is missing, then runs pytest against a throwaway
# PostgreSQL 15 (or IMP_TEST_DSN). pytest's exit code 5 (no tests collected) is a failure.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/bootstrap.sh" || exit 1
cd "$ROOT"
"$ROOT/.venv/bin/python" -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests; treating as failure" >&2
    exit 1
fi
exit "$rc"
