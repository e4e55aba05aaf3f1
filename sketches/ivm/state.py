"""Persisting pipeline state in ``imp.ivm_state`` (pg_extensions/002_audit.sql) and reloading
it, so a restarted proxy resumes incremental maintenance instead of recapturing.

A row holds the pipeline's :meth:`~sketches.ivm.pipeline.Pipeline.snapshot` (``state`` jsonb:
format, plan fingerprint, table oids, epochs, every stateful operator's state), with its
``version`` (pg_snapshot) and ``epochs`` as columns for inspection and GC (the oldest live
version of a table bounds ``imp.gc_deltas``). Writes happen in the caller's transaction.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from sketches.ivm import collector
from sketches.ivm.codec import Json, dumps, loads
from sketches.ivm.errors import StateFormatError
from sketches.ivm.pipeline import Head, Pipeline

log = logging.getLogger(__name__)


def save(conn: psycopg.Connection[Any], key: str, pipeline: Pipeline,
         head: Head | None = None) -> None:
    """Upserts the pipeline's state under ``key`` (e.g. the sketch id or template+params):
    that of its own query, or of ``head``'s (:meth:`Pipeline.snapshot`), made and freed in
    one pause of the collector (:mod:`sketches.ivm.collector`)."""
    with collector.paused():
        write(conn, key, pipeline.snapshot(head))


def write(conn: psycopg.Connection[Any], key: str, snap: dict[str, Json]) -> None:
    """Upserts ``snap`` (a :meth:`Pipeline.snapshot`) under ``key``. Apart from :func:`save`
    so that a caller can take the snapshot under its lock and write it after."""
    relids, epochs = snap["relids"], snap["epochs"]
    assert isinstance(relids, list) and isinstance(epochs, list)
    with collector.paused():
        conn.execute(
            "INSERT INTO imp.ivm_state (sketch_key, version, epochs, state)"
            " VALUES (%s, %s::pg_snapshot, %s, %s)"
            " ON CONFLICT (sketch_key) DO UPDATE SET version = EXCLUDED.version,"
            " epochs = EXCLUDED.epochs, state = EXCLUDED.state, updated_at = now()",
            (key, snap["version"], Jsonb(dict(zip(map(str, relids), epochs, strict=True))),
             Jsonb(snap, dumps=dumps)))
    if log.isEnabledFor(logging.DEBUG):   # the whole state encoded again: seconds when large
        log.debug("saved state %s at %s (%d bytes)", key, snap["version"],
                  len(json.dumps(snap)))


_CURRENT_EPOCHS = (
    "NOT EXISTS (SELECT 1 FROM jsonb_each_text(s.epochs) AS e(rel, epoch)"
    " LEFT JOIN imp.tracked_tables AS t ON t.relid = e.rel::oid"
    " WHERE t.epoch IS DISTINCT FROM e.epoch::bigint)")
"""SQL: every table of the row ``s`` is tracked at the epoch the state was saved at."""


def load(conn: psycopg.Connection[Any], key: str, pipeline: Pipeline) -> bool:
    """Restores ``pipeline`` from the row ``key``; False if there is none, or if a table of
    it was truncated, altered or untracked since it was saved (its epoch moved). Raises
    :class:`StateFormatError` if the row belongs to another plan (the caller recaptures).

    Why the epochs here: such a state can never be maintained again, and loaded it was
    decoded only for its first maintenance to fail and the sketch to be captured anew — once
    per sketch after every TRUNCATE or DDL under eager maintenance, whose background detaches
    an invalidated state but keeps the sketch (found by a helper's search in session 31)."""
    with collector.paused():
        row = conn.execute("SELECT state::text, " + _CURRENT_EPOCHS + " FROM imp.ivm_state AS s"
                           " WHERE sketch_key = %s", (key,)).fetchone()
        if row is None:
            return False
        if not row[1]:
            log.info("state %s: a table's epoch moved since it was saved: not loaded", key)
            return False
        state = loads(row[0])
        if not isinstance(state, dict):
            raise StateFormatError(f"state {key} is not a JSON object")
        pipeline.restore(state)
    return True


def delete(conn: psycopg.Connection[Any], key: str, version: str | None = None) -> bool:
    """Deletes the state ``key`` (only at ``version``, when given); True if there was one."""
    if version is None:
        cur = conn.execute("DELETE FROM imp.ivm_state WHERE sketch_key = %s", (key,))
    else:
        cur = conn.execute("DELETE FROM imp.ivm_state WHERE sketch_key = %s"
                           " AND version::text = %s", (key, version))
    return cur.rowcount > 0


def oldest_versions(conn: psycopg.Connection[Any]) -> dict[int, str]:
    """Per table oid, the persisted version with the smallest xmin (a GC bound for
    ``imp.gc_deltas``: pass it only if no other, unpersisted state is older)."""
    rows = conn.execute(
        "SELECT DISTINCT ON (rel) rel::bigint, version::text FROM imp.ivm_state,"
        " LATERAL jsonb_object_keys(epochs) AS rel"
        " ORDER BY rel, pg_snapshot_xmin(version)").fetchall()
    return {int(r[0]): str(r[1]) for r in rows}
