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


_USER_EVENT_TRIGGERS = (
    "EXISTS (SELECT FROM pg_catalog.pg_event_trigger AS e"
    " JOIN pg_catalog.pg_proc AS p ON p.oid OPERATOR(pg_catalog.=) e.evtfoid"
    " JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace"
    " WHERE e.evtenabled OPERATOR(pg_catalog.<>) 'D'"
    " AND n.nspname OPERATOR(pg_catalog.<>) 'imp')")
"""SQL: an enabled event trigger other than schema imp's own (whose functions live there)."""

_UNCOUNTED = ("(NOT pg_catalog.current_setting('track_counts')::pg_catalog.bool AND "
              + _USER_EVENT_TRIGGERS + ")")
"""SQL: this transaction's row counts are not kept, and a user's event trigger may have
written rows in it: it may have written to any table."""

_WROTE_USER_DATA = (
    "SELECT " + _USER_EVENT_TRIGGERS + " AND (" + _UNCOUNTED + " OR EXISTS ("
    "SELECT FROM pg_catalog.pg_stat_xact_user_tables AS t"
    " WHERE t.schemaname OPERATOR(pg_catalog.<>) 'imp'"
    " AND t.schemaname OPERATOR(pg_catalog.!~~) 'pg\\_temp\\_%'"
    " AND t.n_tup_ins + t.n_tup_upd + t.n_tup_del > 0))")

_WROTE_TABLES = (
    "WITH RECURSIVE tree(relid) AS ("
    "SELECT pg_catalog.unnest(%s::pg_catalog.oid[]) UNION SELECT i.inhrelid"
    " FROM pg_catalog.pg_inherits AS i JOIN tree ON i.inhparent OPERATOR(pg_catalog.=) tree.relid)"
    " SELECT " + _UNCOUNTED + " OR EXISTS (SELECT FROM tree"
    " WHERE pg_catalog.pg_stat_get_xact_tuples_inserted(relid)"
    " + pg_catalog.pg_stat_get_xact_tuples_updated(relid)"
    " + pg_catalog.pg_stat_get_xact_tuples_deleted(relid) > 0)")


def wrote_user_data(conn: psycopg.Connection[Any]) -> bool:
    """Did the current transaction of the manager write rows outside schema imp (and its own
    temporary tables)? Only a user's event trigger, fired by the manager's DDL (the install,
    an ``ALTER TABLE … SET STATISTICS``, tracking), can make it: such a transaction is no
    catalog-only one (found: an event trigger keeping a DDL log). Cheap without user event
    triggers (none: False, nothing else read)."""
    row = conn.execute(_WROTE_USER_DATA).fetchone()
    return row is not None and bool(row[0])


def wrote_tables(conn: psycopg.Connection[Any], relids: Collection[int]) -> bool:
    """Did the current transaction write rows of ``relids`` or their inheritance children?
    A transaction sees its own writes whatever its snapshot: a capture after such a write
    would describe rows the client's snapshot does not hold (found: a user's event trigger,
    fired by the manager's ``ALTER TABLE … SET STATISTICS``, wrote to the queried table, and
    the first answer was built from those rows)."""
    row = conn.execute(_WROTE_TABLES, (sorted(relids),)).fetchone()
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
