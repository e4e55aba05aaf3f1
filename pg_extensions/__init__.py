"""Versioned, idempotent SQL that the proxy installs into a database (schema ``imp``).

Files are named ``NNN_description.sql`` and applied in order; each must be safe to run again
(``CREATE ... IF NOT EXISTS``, ``CREATE OR REPLACE``). ``imp.schema_version`` records which
files were applied; a file is re-applied only when its checksum changed.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg

log = logging.getLogger(__name__)

_LOCK_KEY = 0x1A7E_5CE7  # advisory lock serialising concurrent installers


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def migrations() -> list[Migration]:
    """All SQL files of this package, ordered by their numeric prefix."""
    found = []
    for entry in resources.files(__package__).iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:3].isdigit():
            found.append(Migration(int(name[:3]), name, entry.read_text(encoding="utf-8")))
    return sorted(found, key=lambda m: m.version)


def install(conn: psycopg.Connection[Any]) -> list[str]:
    """Applies every migration not yet applied (or changed) in one transaction; returns names.

    Inside a transaction of the caller's it runs in that transaction itself, not in a
    savepoint: a savepoint's writes commit under a subtransaction xid, which a caller that
    records its own transaction's xid (sketches.freshness) would take for someone else's."""
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
        return _apply(conn)
    with conn.transaction():
        return _apply(conn)


def _apply(conn: psycopg.Connection[Any]) -> list[str]:
    applied: list[str] = []
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
    conn.execute("CREATE SCHEMA IF NOT EXISTS imp")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS imp.schema_version ("
        " version int PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,"
        " applied_at timestamptz NOT NULL DEFAULT now())")
    rows = conn.execute("SELECT version, checksum FROM imp.schema_version").fetchall()
    done: dict[int, str] = {int(v): str(c) for v, c in rows}
    for m in migrations():
        if done.get(m.version) == m.checksum:
            continue
        log.info("applying %s", m.name)
        conn.execute(m.sql.encode())
        conn.execute(
            "INSERT INTO imp.schema_version (version, name, checksum) VALUES (%s, %s, %s)"
            " ON CONFLICT (version) DO UPDATE SET name = EXCLUDED.name,"
            " checksum = EXCLUDED.checksum, applied_at = now()",
            (m.version, m.name, m.checksum))
        applied.append(m.name)
    conn.execute(_guard_sql())
    return applied


DDL_GUARD = ("imp_ddl_end", "imp_ddl_drop", "imp_audit_guard")
"""The event triggers of ``ddl_guard.sql``."""

GUARDED = ("SELECT count(*) = 3 FROM pg_catalog.pg_event_trigger WHERE evtname IN ("
            + ", ".join(f"'{n}'" for n in DDL_GUARD) + ") AND evtenabled = 'A'")
"""True when the DDL guard is there and fires ALWAYS; a query for other statements to embed
too (``pg_event_trigger`` is readable by every role)."""


def _guard_sql() -> bytes:
    return resources.files(__package__).joinpath("ddl_guard.sql").read_bytes()


def ddl_guarded(conn: psycopg.Connection[Any]) -> bool:
    """Is imp's DDL guard (its event triggers, enabled ALWAYS) there? Only a superuser may
    create event triggers, so a schema imp a role that is no superuser installed has none,
    and a superuser's proxy then used it as it was (found by a helper's search in session
    25: an ``ALTER … TYPE … USING`` went unseen and a maintained sketch lost a group). Without
    the guard nothing is maintained incrementally."""
    row = conn.execute(GUARDED).fetchone()
    return bool(row and row[0])
