#!/usr/bin/env bash
# The main job: installs what is missing, then runs the demo. With no DSN (IMP_UPSTREAM or
# --upstream) it starts a throwaway local PostgreSQL 15 of its own.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/imp-proxy" demo "$@"
