"""The PostgreSQL execution backend (the default): everything runs in one pushed-down query on
the caller's connection, in its snapshot.

* capture: :func:`sketches.capture.capture` (the capture query of ``sketches.sql.rewrite``);
* state building: ``SELECT g…, frag…, count(*), count(x) | sum(x), count(x) … FROM <the
  query's tables> WHERE <join equalities and WHERE> GROUP BY g…, frag…`` and, per min/max
  aggregate, the distinct values with multiplicities per group (ranked and cut at
  ``buffer_limit``) — the row shape of :mod:`sketches.backends.base`;
* full maintenance: both in one REPEATABLE READ snapshot;
* ΔR⋈S': the rows of S joined with the unnested delta keys.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import pq, sql

from sketches import service
from sketches.backends.base import (
    AggregateState,
    BackendUnsupported,
    FullMaintenance,
    MatchRequest,
    PartialRow,
    Row,
    ValueRow,
    aggregate_functions,
)
from sketches.capture import CaptureResult, CaptureTarget, capture
from sketches.errors import CaptureError
from sketches.sql.model import Expression, QueryAnalysis

log = logging.getLogger(__name__)


@contextmanager
def snapshot_transaction(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Makes sure the body runs in one snapshot: an idle autocommit connection gets its own
    ``BEGIN ISOLATION LEVEL REPEATABLE READ`` … ``COMMIT``; a connection already inside a
    transaction (the manager's, in the client's snapshot) is used as it is."""
    own = conn.autocommit and conn.info.transaction_status == pq.TransactionStatus.IDLE
    if own:
        service.begin(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ")
    ok = False
    try:
        yield
        ok = True
    finally:
        if own:
            conn.execute("COMMIT" if ok else "ROLLBACK")


def resolve_schemas(conn: psycopg.Connection[Any], analysis: QueryAnalysis,
                    targets: Sequence[CaptureTarget]) -> list[str]:
    """The schema of every table of the query, resolved through the connection's search_path
    (other connections, e.g. JDBC ones, have a different search_path)."""
    known = {t.table.index: t.schema for t in targets}
    out = []
    for t in analysis.tables:
        if t.index in known:
            out.append(known[t.index])
            continue
        if t.qualifier is not None:
            out.append(t.qualifier)
            continue
        row = conn.execute(
            "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.oid = to_regclass(quote_ident(%s))", (t.name,)).fetchone()
        if row is None:
            raise BackendUnsupported(f"relation {t.name!r} not found")
        out.append(str(row[0]))
    return out


def key_expressions(analysis: QueryAnalysis) -> list[Expression]:
    """The aggregate operator's group key: GROUP BY, or the select list of a DISTINCT."""
    if analysis.is_aggregate:
        if not analysis.group_by:
            raise BackendUnsupported("scalar aggregate")
        return list(analysis.group_by)
    if analysis.distinct:
        if any(i.expr is None for i in analysis.select):
            raise BackendUnsupported("DISTINCT over *")
        return [i.expr for i in analysis.select if i.expr is not None]
    raise BackendUnsupported("no aggregation or DISTINCT: no aggregate state to build")


def from_where(analysis: QueryAnalysis, schemas: Sequence[str],
               extra: Sequence[sql.Composable] = ()) -> sql.Composed:
    """``FROM t1 AS a1, … WHERE <join equalities> AND <WHERE>`` of the flattened query."""
    tables = sql.SQL(", ").join(
        sql.SQL("{} AS {}").format(sql.Identifier(s, t.name), sql.Identifier(t.alias))
        for s, t in zip(schemas, analysis.tables, strict=True))
    conds: list[sql.Composable] = [
        sql.SQL("{} = {}").format(sql.Identifier(analysis.tables[a.table].alias, a.column),
                                  sql.Identifier(analysis.tables[b.table].alias, b.column))
        for a, b in analysis.join_equalities]
    conds += [sql.SQL("({})").format(sql.SQL(w.sql)) for w in analysis.where]
    conds += list(extra)
    if not conds:
        return sql.SQL("FROM {}").format(tables)
    return sql.SQL("FROM {} WHERE {}").format(tables, sql.SQL(" AND ").join(conds))


def _run(conn: psycopg.Connection[Any], query: sql.Composable,
         params: Sequence[object] | None) -> list[tuple[Any, ...]]:
    text = query.as_string(conn)
    with psycopg.RawCursor(conn) as cur:
        cur.execute(text, list(params) if params else None)
        return cur.fetchall()


class PostgresBackend:
    """Runs every heavy operation as pushed-down SQL on the caller's connection."""

    name = "postgres"

    def capture(self, conn: psycopg.Connection[Any], sql_text: str, analysis: QueryAnalysis,
                targets: Sequence[CaptureTarget],
                params: Sequence[object] | None = None) -> CaptureResult:
        return capture(conn, sql_text, analysis, targets, params)

    def build_state(self, conn: psycopg.Connection[Any], analysis: QueryAnalysis,
                    targets: Sequence[CaptureTarget], params: Sequence[object] | None = None,
                    buffer_limit: int | None = None) -> AggregateState:
        started = time.perf_counter()
        functions = aggregate_functions(analysis)
        keys = key_expressions(analysis)
        schemas = resolve_schemas(conn, analysis, targets)
        with snapshot_transaction(conn):
            row = conn.execute("SELECT pg_current_snapshot()::text").fetchone()
            assert row is not None
            partials = self._partials(conn, analysis, targets, params, functions, keys, schemas)
            values: list[ValueRow] = []
            truncated: list[tuple[Row, int]] = []
            for j, fn in enumerate(functions):
                if fn in ("min", "max"):
                    v, t = self._values(conn, analysis, params, keys, schemas, j, fn,
                                        buffer_limit)
                    values += v
                    truncated += t
        seconds = time.perf_counter() - started
        return AggregateState.build(str(row[0]), functions, len(targets), partials, values,
                                    truncated, self.name, seconds)

    def _partials(self, conn: psycopg.Connection[Any], analysis: QueryAnalysis,
                  targets: Sequence[CaptureTarget], params: Sequence[object] | None,
                  functions: Sequence[str], keys: Sequence[Expression],
                  schemas: Sequence[str]) -> list[PartialRow]:
        cols: list[sql.Composable] = [sql.SQL(e.sql) for e in keys]
        cols += [t.partition.fragment_sql(sql.Identifier(t.table.alias, t.column))
                 for t in targets]
        group = sql.SQL(", ").join(sql.SQL(str(i + 1)) for i in range(len(cols)))
        cols.append(sql.SQL("count(*)"))
        for fn, agg in zip(functions, analysis.aggregates, strict=True):
            if agg.arg is None:
                cols.append(sql.SQL("count(*)"))
                continue
            arg = sql.SQL("({})").format(sql.SQL(agg.arg.sql))
            if fn in ("sum", "avg"):
                cols.append(sql.SQL("sum({})").format(arg))
            cols.append(sql.SQL("count({})").format(arg))
        query = sql.SQL("SELECT {} {} GROUP BY {}").format(
            sql.SQL(", ").join(cols), from_where(analysis, schemas), group)
        out = []
        nk, nf = len(keys), len(targets)
        for r in _run(conn, query, params):
            pos = nk + nf + 1
            parts: list[Any] = []
            for fn in functions:
                if fn in ("sum", "avg"):
                    parts.append((r[pos], int(r[pos + 1])))
                    pos += 2
                else:
                    parts.append(int(r[pos]))
                    pos += 1
            out.append(PartialRow(tuple(r[:nk]), tuple(r[nk:nk + nf]), int(r[nk + nf]),
                                  tuple(parts)))
        return out

    def _values(self, conn: psycopg.Connection[Any], analysis: QueryAnalysis,
                params: Sequence[object] | None, keys: Sequence[Expression],
                schemas: Sequence[str], j: int, fn: str,
                limit: int | None) -> tuple[list[ValueRow], list[tuple[Row, int]]]:
        arg = analysis.aggregates[j].arg
        assert arg is not None
        value = sql.SQL("({})").format(sql.SQL(arg.sql))
        key_cols = [sql.SQL(e.sql) for e in keys]
        names = [sql.Identifier(f"k{i}") for i in range(len(keys))]
        partition = sql.SQL(", ").join(names) if names else sql.SQL("1")
        direction = sql.SQL("DESC" if fn == "max" else "ASC")
        inner = sql.SQL(
            "SELECT {keys}, {v} AS v, count(*) AS m {fw} GROUP BY {group}").format(
            keys=sql.SQL(", ").join(sql.SQL("{} AS {}").format(c, n)
                                    for c, n in zip(key_cols, names, strict=True)),
            v=value,
            fw=from_where(analysis, schemas, [sql.SQL("{} IS NOT NULL").format(value)]),
            group=sql.SQL(", ").join(sql.SQL(str(i + 1)) for i in range(len(keys) + 1)))
        ranked = sql.SQL(
            "SELECT {names}, v, m, row_number() OVER (PARTITION BY {p} ORDER BY v {d}),"
            " count(*) OVER (PARTITION BY {p}) FROM ({inner}) AS q").format(
            names=sql.SQL(", ").join(names), p=partition, d=direction, inner=inner)
        if limit is not None:
            ranked = sql.SQL("SELECT * FROM ({}) AS r WHERE row_number <= {}").format(
                ranked, sql.Literal(limit))
        values, truncated = [], set()
        nk = len(keys)
        for r in _run(conn, ranked, params):
            key = tuple(r[:nk])
            values.append(ValueRow(key, j, r[nk], int(r[nk + 1])))
            if limit is not None and int(r[nk + 3]) > limit:
                truncated.add((key, j))
        return values, sorted(truncated, key=repr)

    def full_maintenance(self, conn: psycopg.Connection[Any], sql_text: str,
                         analysis: QueryAnalysis, targets: Sequence[CaptureTarget],
                         params: Sequence[object] | None = None,
                         buffer_limit: int | None = None) -> FullMaintenance:
        with snapshot_transaction(conn):
            result = self.capture(conn, sql_text, analysis, targets, params)
            state = self.build_state(conn, analysis, targets, params, buffer_limit)
        if state.version != result.version:
            raise CaptureError("capture and state building saw different snapshots")
        return FullMaintenance(result, state)

    def match_rows(self, conn: psycopg.Connection[Any], request: MatchRequest,
                   keys: Collection[Row]) -> list[Row]:
        distinct = sorted({tuple(k) for k in keys if all(v is not None for v in k)}, key=repr)
        if not distinct:
            return []
        types = column_types(conn, request.schema, request.table, request.key_columns)
        arrays = [[k[i] for k in distinct] for i in range(len(request.key_columns))]
        alias = sql.Identifier("s")
        cols: list[sql.Composable] = [sql.Identifier("s", c) for c in request.columns]
        if request.target is not None:
            cols.append(request.target.partition.fragment_sql(
                sql.Identifier("s", request.target.column)))
        kstrings = [f"k{i}" for i in range(len(arrays))]
        knames = [sql.Identifier(k) for k in kstrings]
        query = sql.SQL("SELECT {cols} FROM {t} AS {a} JOIN unnest({arrays}) AS k({kn})"
                        " ON {on}").format(
            cols=sql.SQL(", ").join(cols), t=sql.Identifier(request.schema, request.table),
            a=alias,
            arrays=sql.SQL(", ").join(sql.SQL("%s::{}[]").format(sql.SQL(t)) for t in types),
            kn=sql.SQL(", ").join(knames),
            on=sql.SQL(" AND ").join(
                sql.SQL("{} = {}").format(sql.Identifier("s", c), sql.Identifier("k", k))
                for c, k in zip(request.key_columns, kstrings, strict=True)))
        return [tuple(r) for r in conn.execute(query, arrays).fetchall()]


def column_types(conn: psycopg.Connection[Any], schema: str, table: str,
                 columns: Sequence[str]) -> list[str]:
    """``format_type`` of each column (trusted catalog text, used in casts)."""
    rows = dict(conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
        " WHERE a.attrelid = (quote_ident(%s) || '.' || quote_ident(%s))::regclass"
        " AND a.attnum > 0 AND NOT a.attisdropped", (schema, table)).fetchall())
    missing = [c for c in columns if c not in rows]
    if missing:
        raise BackendUnsupported(f"no column(s) {missing} in {schema}.{table}")
    return [str(rows[c]) for c in columns]
