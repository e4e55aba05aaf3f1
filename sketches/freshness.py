"""Is a sketch captured at snapshot V still exact in the current snapshot S? — a rule that is
never wrong, used until incremental maintenance (issue 4) plugs into the manager.

The database state a snapshot sees is determined by the set of committed transactions it
treats as visible. If every transaction that committed and is visible in exactly one of V and
S (the symmetric difference) is known not to have modified user data, then V and S see the
same rows in every user table, and a sketch exact for V is exact for S.

"Known not to have modified user data" = the transaction is one of the manager's own
catalog-writing transactions (its xids are recorded when it writes; those transactions touch
only schema ``imp`` and statistics). Aborted transactions changed nothing. Everything else —
any commit anywhere in the cluster, on any table — counts as a change. This is coarse (a
write to an unrelated table forces a recapture) but exact; it never relies on
``pg_stat_*`` counters (not transactional) or sequence numbers (sequence order is not commit
order). Transactions whose status is no longer known (``pg_xact_status`` NULL) count as
changes; so do histories longer than ``horizon`` xids, to bound the check's cost.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

import psycopg

log = logging.getLogger(__name__)

DEFAULT_HORIZON = 200_000

_CHECK = """
WITH s AS (SELECT pg_current_snapshot() AS cur, %(v)s::pg_snapshot AS v),
     r AS (SELECT cur, v,
                  least(pg_snapshot_xmin(cur), pg_snapshot_xmin(v))::text::bigint AS lo,
                  greatest(pg_snapshot_xmax(cur), pg_snapshot_xmax(v))::text::bigint AS hi
           FROM s)
SELECT CASE WHEN r.hi - r.lo > %(horizon)s THEN true ELSE EXISTS (
    SELECT 1 FROM generate_series(r.lo, r.hi - 1) AS g(x)
    WHERE pg_visible_in_snapshot(x::text::xid8, r.cur)
          IS DISTINCT FROM pg_visible_in_snapshot(x::text::xid8, r.v)
      AND pg_xact_status(x::text::xid8) IS DISTINCT FROM 'aborted'
      AND x <> ALL(%(own)s::bigint[])) END
FROM r
"""


def changed_since(conn: psycopg.Connection[Any], version: str, own_xids: Collection[int],
                  horizon: int = DEFAULT_HORIZON) -> bool:
    """True unless the current snapshot provably sees the same user data as ``version``."""
    row = conn.execute(_CHECK, {"v": version, "horizon": horizon,
                                "own": sorted(own_xids)}).fetchone()
    changed = True if row is None else bool(row[0])
    log.debug("changed since %s: %s", version, changed)
    return changed


DDL_FLAG = "imp.manager_ddl"
"""A transaction-local setting the manager turns on before it runs DDL (:func:`note_ddl`)."""

_USER_EVENT_TRIGGERS = (
    "EXISTS (SELECT FROM pg_catalog.pg_event_trigger AS e"
    " JOIN pg_catalog.pg_proc AS p ON p.oid OPERATOR(pg_catalog.=) e.evtfoid"
    " JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace"
    " WHERE n.nspname OPERATOR(pg_catalog.<>) 'imp' AND CASE e.evtenabled"
    " WHEN 'A' THEN true"
    " WHEN 'O' THEN pg_catalog.current_setting('session_replication_role')"
    " OPERATOR(pg_catalog.<>) 'replica'"
    " WHEN 'R' THEN pg_catalog.current_setting('session_replication_role')"
    " OPERATOR(pg_catalog.=) 'replica' ELSE false END)")
"""SQL: an event trigger other than schema imp's own (whose functions live there) fires in
this session."""

_FLAG = "pg_catalog.current_setting('" + DDL_FLAG + "', true)"

_NOTE_DDL = ("SELECT pg_catalog.set_config('" + DDL_FLAG + "', CASE WHEN " + _FLAG
             + " OPERATOR(pg_catalog.=) 'fired' OR " + _USER_EVENT_TRIGGERS
             + " THEN 'fired' ELSE 'on' END, true)")

_RAN_DDL = ("SELECT " + _FLAG + " OPERATOR(pg_catalog.=) 'fired' OR " + _FLAG
            + " OPERATOR(pg_catalog.=) 'on' AND " + _USER_EVENT_TRIGGERS)


def note_ddl(conn: psycopg.Connection[Any]) -> None:
    """Marks the current transaction as one in which the manager runs DDL (call it first):
    ``fired`` when a user's event trigger fires in this session now, else ``on``; never
    back from ``fired``. Why now too: a trigger may disable or drop itself (or be dropped)
    before :func:`user_triggers_ran` looks (found: a one-shot trigger changed the queried
    rows and disabled itself). Transaction-local: a rollback takes it back with the DDL."""
    conn.execute(_NOTE_DDL)


def user_triggers_ran(conn: psycopg.Connection[Any]) -> bool:
    """May a user's event trigger have changed data in the current transaction? True when
    the manager ran DDL in it (:func:`note_ddl`: the install, an ``ALTER TABLE … SET
    STATISTICS``, tracking) while a user's event trigger fired in this session, before that
    DDL or now.

    Why it matters: a transaction sees its own writes whatever its snapshot, so a capture
    after such a write describes rows the client's snapshot does not hold (found: an event
    trigger keeping a DDL log wrote the capture's own ``ALTER TABLE`` into the queried log,
    and the first answer was built from it); and such a transaction is no catalog-only one
    for the freshness rule. Why not the transaction's row counts: a TRUNCATE resets them,
    DETACH or DROP PARTITION writes none (found: a partition emptied so), and on PostgreSQL
    15 they still hold counts of the backend's earlier transactions for up to a second."""
    row = conn.execute(_RAN_DDL).fetchone()
    return row is not None and bool(row[0])


def current_xid(conn: psycopg.Connection[Any]) -> int:
    """The current transaction's xid (assigning one if it has none yet)."""
    row = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
    assert row is not None
    return int(row[0])


def assigned_xid(conn: psycopg.Connection[Any]) -> int | None:
    """The current transaction's xid, or None when it has none (it wrote nothing)."""
    row = conn.execute("SELECT pg_current_xact_id_if_assigned()::text::bigint").fetchone()
    return None if row is None or row[0] is None else int(row[0])


def current_snapshot(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT pg_current_snapshot()::text").fetchone()
    assert row is not None
    return str(row[0])
