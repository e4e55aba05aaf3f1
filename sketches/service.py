"""The settings of the proxy's own connections (service and maintenance), per transaction.

``idle_in_transaction_session_timeout`` 0: a database or role default may set one for clients,
but these transactions wait on Python between statements (a large delta's step, a state
build), and a short timeout ended them part-way: every capture and maintenance failed, and
the queries passed through.

``lock_timeout`` :data:`SERVICE_LOCK_WAIT`: a wrapped query's client backend holds ACCESS
SHARE on the query's tables while a service connection prepares it. A TRUNCATE queued behind
that lock queues every later lock request on the table, a service connection's too, and the
wait for each other runs through the proxy, where PostgreSQL's deadlock detector cannot see
it; the bounded wait ends it (the query passes through).

Why per transaction (``SET LOCAL``), not per session: behind a transaction pooler (PgBouncer
``pool_mode = transaction``) each autocommit statement of a session may run on another
server connection, and a session-level ``SET`` stays on whichever one ran it, for the
pooler's next client (found: clients of the proxy, and of the pooler past it, waited at most
2 s for a lock and lost the database's idle-in-transaction limit).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import pq
from psycopg.rows import Row

SERVICE_LOCK_WAIT = "2s"
"""The longest a connection of the proxy's own waits for a lock (a client's shorter
``lock_timeout`` is taken for a query's prepare)."""

LOCAL_SETTINGS = ("SET LOCAL idle_in_transaction_session_timeout = 0; "
                  f"SET LOCAL lock_timeout = '{SERVICE_LOCK_WAIT}'")
"""One simple Query. ``SET`` takes no snapshot, so it may precede ``SET TRANSACTION``."""


class ServiceConnection(psycopg.Connection[Row]):
    """A connection of the proxy's own: each transaction it opens with :meth:`transaction`
    (or :func:`begin`) runs under :data:`LOCAL_SETTINGS`."""

    @contextmanager
    def transaction(self, savepoint_name: str | None = None,
                    force_rollback: bool = False) -> Iterator[psycopg.Transaction]:
        outermost = self.info.transaction_status == pq.TransactionStatus.IDLE
        with super().transaction(savepoint_name, force_rollback) as tx:
            if outermost:
                self.execute(LOCAL_SETTINGS)
            yield tx


def begin(conn: psycopg.Connection[Any], statement: str) -> None:
    """``statement`` (a ``BEGIN …``), followed on a :class:`ServiceConnection` by
    :data:`LOCAL_SETTINGS` in the same round trip."""
    conn.execute(f"{statement}; {LOCAL_SETTINGS}" if isinstance(conn, ServiceConnection)
                 else statement)
