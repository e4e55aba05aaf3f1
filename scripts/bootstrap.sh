#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian 12 machine, idempotently:
# Debian packages (PostgreSQL 15 server, pgjdbc jar, pgbouncer) and a virtualenv in .venv
# with the project and its extras. Sourced by demo.sh and test.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

need_apt=()
[ -x /usr/lib/postgresql/15/bin/initdb ] || need_apt+=(postgresql-15)
command -v psql >/dev/null 2>&1 || need_apt+=(postgresql-client-15)
[ -f /usr/share/java/postgresql.jar ] || need_apt+=(libpostgresql-jdbc-java)
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || need_apt+=(pgbouncer)
command -v javac >/dev/null 2>&1 || need_apt+=(openjdk-17-jdk-headless)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "bootstrap: installing Debian packages: ${need_apt[*]}" >&2
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

stamp="$VENV/.imp-installed"
want="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "bootstrap: installing Python packages into $VENV" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
    "$VENV/bin/pip" install -q -e "$ROOT[dev,spark,bench]" 2>&1 | grep -v '^WARNING: Location' || true
    "$VENV/bin/python" -c "import psycopg, pglast, pyspark, sortedcontainers, pybloom_live" 
    echo "$want" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"
