"""Lookups in the user database's catalog: tables through search_path, their columns and
indexes. Used by the manager to resolve queries and choose sketch attributes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql as psql

from sketches.safety import SafeAttribute
from sketches.sql import ColumnResolver


def resolver(conn: psycopg.Connection[Any]) -> ColumnResolver:
    """Column lists from the catalog, resolved through the connection's search_path."""
    cache: dict[tuple[str | None, str], list[str] | None] = {}

    def columns(schema: str | None, table: str) -> list[str] | None:
        key = (schema, table)
        if key not in cache:
            resolved = resolve_table(conn, schema, table)
            if resolved is None:
                cache[key] = None
            else:
                rows = conn.execute(
                    "SELECT a.attname FROM pg_attribute a WHERE a.attrelid ="
                    " (quote_ident(%s) || '.' || quote_ident(%s))::regclass"
                    " AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
                    resolved).fetchall()
                cache[key] = [r[0] for r in rows]
        return cache[key]

    return columns


def resolve_table(conn: psycopg.Connection[Any], schema: str | None,
                   table: str) -> tuple[str, str] | None:
    """``(schema, table)`` of a base table (or partitioned table / matview) as the query
    names it, resolved through search_path; None for views and unknown names."""
    name = psql.SQL("quote_ident(%s)") if schema is None else \
        psql.SQL("quote_ident(%s) || '.' || quote_ident(%s)")
    args: tuple[str, ...] = (table,) if schema is None else (schema, table)
    row = conn.execute(
        psql.SQL("SELECT n.nspname, c.relname, c.relkind FROM pg_class c"
                 " JOIN pg_namespace n ON n.oid = c.relnamespace"
                 " WHERE c.oid = to_regclass({})").format(name), args).fetchone()
    if row is None or row[2] not in ("r", "p", "m"):
        return None
    return str(row[0]), str(row[1])


def prefer_indexed(conn: psycopg.Connection[Any], schema: str, table: str,
                    attrs: Sequence[SafeAttribute]) -> SafeAttribute:
    """The first safe attribute that leads an index (the skipping predicate can use it),
    else the first one."""
    rows = conn.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a"
        " ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
        " WHERE i.indrelid = (quote_ident(%s) || '.' || quote_ident(%s))::regclass",
        (schema, table)).fetchall()
    indexed = {r[0] for r in rows}
    return next((a for a in attrs if a.column.column in indexed), attrs[0])
