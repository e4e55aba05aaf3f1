"""Deltas pre-aggregated in PostgreSQL for grouped aggregates (``Options.preaggregate``).

Why: the per-row Python work of the operators then runs once per touched (group, fragments)
— and for min/max once per touched (group, value) — instead of once per audit row, and a
join's delta never crosses the wire row by row.

A join's delta is expanded by inclusion–exclusion over the tables that changed
(``Ti'``: table ``i`` in the query's snapshot, ``ΔTi``: its audit rows since the version)::

    Δ(T0 ⋈ … ⋈ Tn) = Σ over non-empty X ⊆ {0…n} of (−1)^(|X|+1) · ⋈_{i∈X} ΔTi ⋈_{i∉X} Ti'

(for two tables: ΔR ⋈ S' + R' ⋈ ΔS − ΔR ⋈ ΔS, the rule of DESIGN §7), one ``UNION ALL`` term
per X, all in the one snapshot. A term whose ``ΔTi`` has no row passing ``Ti``'s WHERE is cut
by a one-time filter, so PostgreSQL never scans ``R'`` for an empty ``ΔS`` — nor, for the term
``ΔR ⋈ ΔS``, probes an empty ``ΔS`` once per row of ``ΔR`` (a nested loop the planner picks
from its estimate of a handful of delta rows; cut, the read of a 134-row ``ΔR`` executed in
0.33 ms instead of 0.42, server log). Each term row
carries the weight ``±Π _mult``; the outer query sums per (group, fragments) with the sums of
the aggregate arguments split by the weight's sign, so the argument's own type (and
PostgreSQL's sum semantics) is kept. That split is exact only when every ``_mult`` is ±1,
which the query counts itself.

An avg over numeric values of varying scale is also grouped by the values' scale: the
accumulator counts the values per scale (the scale of PostgreSQL's avg, which its division
rounds to, is at least the largest of the values present, ``accumulators.SumAcc``), and a
change of one scale carries it in its sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import psycopg
from psycopg import sql

from sketches import deltas
from sketches.ivm.errors import InconsistentDelta
from sketches.ivm.numeric import finite_difference
from sketches.ivm.ops.aggregate import Partial, ValueChange
from sketches.ivm.plan import PlanSpec, TableSpec
from sketches.typeoids import INTEGERS, NUMERIC

PREAGGREGATABLE = frozenset({"count_star", "count", "sum", "avg", "min", "max"})
Conn = psycopg.Connection[Any]


def eligible(spec: PlanSpec) -> bool:
    """True when ``spec``'s delta can be read pre-aggregated: ``Options.preaggregate`` on, a
    grouped aggregate, every WHERE pushed down, no join key filter (it needs the delta rows'
    keys)."""
    opts = spec.options
    return (opts.preaggregate and spec.kind == "aggregate" and not spec.scalar
            and all(a.func in PREAGGREGATABLE for a in spec.aggs)
            and (opts.pushdown or not any(t.where for t in spec.tables))
            and not (spec.joins and opts.join_filter))


def _valued(spec: PlanSpec) -> list[int]:
    """Indexes of the min/max aggregates (their values travel, not a partial)."""
    return [i for i, a in enumerate(spec.aggs) if a.func in ("min", "max")]


def _sketched(spec: PlanSpec) -> list[TableSpec]:
    return [t for t in spec.tables if t.slot is not None and t.fragment is not None]


def _text(text: str) -> sql.Composable:
    """Analysed SQL (printed by pglast, parameters bound) inside a query with parameters."""
    return sql.SQL(text.replace("%", "%%"))


@dataclass(frozen=True, slots=True)
class Layout:
    """What :func:`parse` must know of the query :func:`query` built: ``integer``, the
    sum/avg aggregates (indexes) whose argument is an integer, read as one signed sum."""

    integer: frozenset[int] = frozenset()


def query(conn: Conn, spec: PlanSpec,
          infos: Sequence[deltas.TableInfo]) -> tuple[deltas.DeltaQuery, Layout]:
    """The pre-aggregated delta of ``spec`` (tables tracked as ``infos``, in join order).

    Columns: group keys, one fragment id per sketched table, per min/max aggregate its value
    and ``GROUPING`` flag, the row-count change, per count/sum/avg aggregate its partial
    change(s) (sum/avg: sum over positive weights, sum over negative weights, non-NULL count
    change, the fixed scale of an avg's ``numeric(p, s)`` argument or NULL — of an integer
    argument (``layout.integer``) only the difference of the two sums and the count change;
    count: non-NULL count change), and last the number of joined audit rows whose multiplicity
    is not ±1. With
    min/max the rows come from grouping sets: (groups,
    fragments) rows carry the partials, (groups, value of aggregate i) rows — flag 0 — the
    value's net multiplicity change in the row-count column. An avg argument of type numeric
    without a fixed scale also splits the (groups, fragments) rows by its values' scale
    (:func:`scales`)."""
    positions = range(len(spec.tables))
    terms = [_term(conn, spec, infos, changed)
             for n in range(1, len(spec.tables) + 1)
             for changed in combinations(positions, n)]
    ng, nf = len(spec.group_sql), len(_sketched(spec))
    gcols = [sql.SQL(f"_g{i}") for i in range(ng)]
    fcols = [sql.SQL(f"_f{i}") for i in range(nf)]
    types = summed_types(conn, spec)
    loose, fixed = scales(conn, spec, types)
    integer = frozenset(i for i, (oid, _s) in types.items() if oid in INTEGERS)
    scols = [sql.SQL(f"scale(_a{i})") for i in loose]
    vcols = [sql.SQL(f"_a{i}") for i in _valued(spec)]
    cols: list[sql.Composable] = [*gcols, *fcols, *vcols]
    cols += [sql.SQL("GROUPING({})").format(v) for v in vcols]
    cols.append(sql.SQL("sum(_w)"))
    for i, a in enumerate(spec.aggs):
        nonnull = sql.SQL(f"coalesce(sum(_w) FILTER (WHERE _a{i} IS NOT NULL), 0)")
        if i in integer:   # exact: no NaN or infinity, the sums' type holds any difference
            cols += [sql.SQL(f"coalesce(sum(_a{i}) FILTER (WHERE _w > 0), 0)"
                             f" - coalesce(sum(_a{i}) FILTER (WHERE _w < 0), 0)"), nonnull]
        elif a.func in ("sum", "avg"):
            cols += [sql.SQL(f"sum(_a{i}) FILTER (WHERE _w > 0)"),
                     sql.SQL(f"sum(_a{i}) FILTER (WHERE _w < 0)"), nonnull,
                     sql.SQL("{}::int").format(sql.Literal(fixed.get(i)))]
        elif a.func in ("count", "count_star"):
            cols.append(nonnull)
    cols.append(sql.SQL("count(*) FILTER (WHERE _bad)"))
    sets = [sql.SQL("({})").format(sql.SQL(", ").join([*gcols, *fcols, *scols]))]
    sets += [sql.SQL("({})").format(sql.SQL(", ").join([*gcols, v])) for v in vcols]
    group: sql.Composable
    if vcols:
        group = sql.SQL(" GROUP BY GROUPING SETS ({})").format(sql.SQL(", ").join(sets))
    else:
        group = (sql.SQL(" GROUP BY ") + sql.SQL(", ").join([*gcols, *fcols, *scols])
                 if ng + nf + len(scols) else sql.SQL(""))
    text = sql.SQL("SELECT {} FROM ({}) AS _d{}").format(
        sql.SQL(", ").join(cols), sql.SQL(" UNION ALL ").join(terms), group)
    layout = Layout(integer)
    if len(infos) == 1:
        return _reading(conn, infos, text), layout
    return _reading(conn, infos, text, setup=_join_setup(conn, spec, infos)), layout


def summed_types(conn: Conn, spec: PlanSpec) -> dict[int, tuple[int, int | None]]:
    """The type oid and declared scale (None: none) of each sum/avg aggregate's argument (by
    aggregate index), from a ``LIMIT 0`` query over the tables."""
    summed = [i for i, a in enumerate(spec.aggs) if a.func in ("sum", "avg")]
    if not summed:
        return {}
    args = sql.SQL(", ").join(sql.SQL(spec.agg_sql[i] or "NULL") for i in summed)
    tables = sql.SQL(", ").join(sql.SQL("{} AS {}").format(
        sql.SQL(t.source), sql.Identifier(t.alias)) for t in spec.tables)
    cur = conn.execute(sql.SQL("SELECT {} FROM {} LIMIT 0").format(args, tables))
    return {i: (col.type_code, col.scale)
            for i, col in zip(summed, cur.description or [], strict=True)}


def scales(conn: Conn, spec: PlanSpec, types: dict[int, tuple[int, int | None]] | None = None
           ) -> tuple[list[int], dict[int, int]]:
    """The avg aggregates (indexes) whose argument is a numeric without a fixed scale, and the
    scale of each whose argument is a ``numeric(p, s)`` (all its values have scale ``s``: the
    accumulator counts them exactly, ``accumulators.SumAcc``; 0 for a negative ``s``, which
    PostgreSQL 15 allows: ``numeric(7, -2)`` rounds to hundreds, and its values have display
    scale 0 — taken as −2, avg's total was quantized to 78 digits, a wrong answer beside a
    constant). A sum's scale does not count
    (compared or added, its value is all the engine uses). The types come from a ``LIMIT 0``
    query over the tables (:func:`summed_types`, unless given). Other types have no scale
    (int: always 0)."""
    if not any(a.func == "avg" for a in spec.aggs):
        return [], {}
    if types is None:
        types = summed_types(conn, spec)
    numeric = [(i, s) for i, (oid, s) in types.items()
               if spec.aggs[i].func == "avg" and oid == NUMERIC]
    return ([i for i, s in numeric if s is None],
            {i: max(s, 0) for i, s in numeric if s is not None})


def _reading(conn: Conn, infos: Sequence[deltas.TableInfo], text: sql.Composable,
             setup: sql.Composable | None = None) -> deltas.DeltaQuery:
    """``text`` as a query that reads the audit tables of all ``infos`` (with ``setup``
    before it, when given: see :class:`deltas.DeltaQuery`)."""
    first, *rest = infos
    return deltas.DeltaQuery(first.relid, first.audit_table, text.as_bytes(conn),
                             tuple((i.relid, i.audit_table) for i in rest),
                             setup=None if setup is None else setup.as_bytes(conn))


PROBE_COST = 8
"""An index probe of a nested loop costs about this many rows of a sequential scan feeding a
hash table (measured on the benchmark's tables: ~1 µs against ~0.1 µs)."""
MAX_COUNTED = 100_000
"""Audit rows counted at most to decide the plan (a delta never turns a join with larger
partners into hash joins)."""
SMALL_DELTA = 200
"""Audit rows per table up to which the fetch may run a cached generic plan (see
:func:`_join_setup`)."""


def _join_setup(conn: Conn, spec: PlanSpec, infos: Sequence[deltas.TableInfo]) -> sql.Composable:
    """``enable_nestloop`` off when hash joins read less: every table's delta (passing its
    WHERE) is empty or at least 1/:data:`PROBE_COST` of its partners' rows (their sizes now);
    ``plan_cache_mode`` ``force_custom_plan`` unless every table's delta has at most
    :data:`SMALL_DELTA` rows and nested loops stay on (then ``auto``).

    Why nested loops off: all audit rows of one transaction carry its one xid, so the
    planner, estimating ``_xid >= xmin`` from the spread of xids, expects a handful of delta
    rows and probes the partners' indexes once per row — 4000 probes of a 1000-row table for
    one 2000-row UPDATE, several times the cost of hashing the table. The terms of the tables
    without delta rows are cut before they run, so their plans do not matter.

    Why custom plans for larger deltas: the delta's size is only known from the version, a
    parameter, and a generic plan guesses a third of the audit table. Why not for small ones:
    planning the fetch (a UNION ALL of joins) was half of a small delta's read (0.4–0.5 ms
    of ~1 ms). ``auto`` runs a cached generic plan only when PostgreSQL costs it no higher
    than the custom plans it made, which rules out a hash join over a large partner for a
    small delta; and at most :data:`SMALL_DELTA` probes per table bound what a generic
    nested loop can cost. Never with nested loops off: the generic plan, cached once, would
    then serve both settings (measured: join-mn at 500–1000 delta rows 1.3–2.2 → 2.4–5.7 ms
    with the nested loops of a plan built for a smaller delta). The counts stop at what the
    two decisions need: counting past the cap cost 0.5–1 ms at 500–1000 rows. Each count runs
    once (``OFFSET 0`` keeps the planner from copying it into every use of its column: it had
    counted a 134-row delta four times, 0.18 of the setup's 0.32 ms in ``EXPLAIN ANALYZE``)."""
    rows = conn.execute(
        "SELECT CASE WHEN c.reltuples >= 0 THEN c.reltuples::bigint"
        " ELSE pg_relation_size(c.oid) / 50 END"
        " FROM unnest(%s::oid[]) WITH ORDINALITY AS u(oid, i)"
        " JOIN pg_catalog.pg_class AS c ON c.oid = u.oid ORDER BY u.i",
        ([i.relid for i in infos],)).fetchall()
    sizes = [int(r[0]) for r in rows]
    if len(sizes) != len(infos):
        raise InconsistentDelta("a joined table is gone")
    counts, hashed, small = [], [], []
    for pos, (t, info) in enumerate(zip(spec.tables, infos, strict=True)):
        cap = -(-(sum(sizes) - sizes[pos]) // PROBE_COST)
        n = sql.Identifier(f"_n{pos}")
        # n counted up to cap decides both where cap <= SMALL_DELTA (n < cap: small)
        limit = SMALL_DELTA + 1 if cap > MAX_COUNTED else max(cap, 1)
        counts.append(sql.SQL("(SELECT count(*) FROM ({}) AS _n) AS {}").format(
            _newest(conn, t, info, sql.SQL("1"), limit), n))
        hashed.append(sql.SQL("{n} = 0").format(n=n) if cap > MAX_COUNTED else
                      sql.SQL("({n} = 0 OR {n} >= {cap})").format(n=n, cap=sql.Literal(cap)))
        small.append(sql.SQL("{} <= {}").format(n, sql.Literal(SMALL_DELTA)))
    return sql.SQL(
        "SELECT set_config('enable_nestloop', CASE WHEN _h THEN 'off'"
        " ELSE current_setting('enable_nestloop') END, true),"
        " set_config('plan_cache_mode', CASE WHEN _s AND NOT _h THEN 'auto'"
        " ELSE 'force_custom_plan' END, true), {settings}"
        " FROM (SELECT {hashed} AS _h, {small} AS _s FROM (SELECT {counts} OFFSET 0) AS _c)"
        " AS _d").format(
        hashed=sql.SQL(" AND ").join(hashed), small=sql.SQL(" AND ").join(small),
        settings=sql.SQL(deltas.READ_SETTINGS), counts=sql.SQL(", ").join(counts))


def _newest(conn: Conn, t: TableSpec, info: deltas.TableInfo, output: sql.Composable,
            limit: int) -> sql.Composable:
    """``SELECT output`` of at most ``limit`` of ``t``'s delta rows (passing its own WHERE),
    newest first down the ``_xid`` index.

    Why newest first: for ``EXISTS`` or a bare ``LIMIT`` the planner expects matching rows
    spread over the audit table and scans it from the start, while the delta rows are the
    newest, at its end — a scan of the whole table that grows until garbage collection."""
    return sql.SQL("SELECT {} FROM {} AS {} WHERE {} ORDER BY {} DESC LIMIT {}").format(
        output, deltas.escaped(conn, deltas.audit_source(info)),
        deltas.escaped(conn, sql.Identifier(t.alias)),
        sql.SQL(" AND ").join([deltas.param_delta_filter(conn, t.alias),
                               *(sql.SQL("({})").format(_text(w)) for w in t.where)]),
        deltas.escaped(conn, sql.Identifier(t.alias, "_xid")), sql.Literal(limit))


def _has_delta(conn: Conn, t: TableSpec, info: deltas.TableInfo) -> sql.Composable:
    """Is there a delta row of ``t`` that passes its own WHERE? (The first row read
    decides.)"""
    return sql.SQL("coalesce(({}), false)").format(_newest(conn, t, info, sql.SQL("true"), 1))


def touched_query(conn: Conn, spec: PlanSpec,
                  infos: Sequence[deltas.TableInfo]) -> deltas.DeltaQuery:
    """One row: whether any table has a delta row passing its own WHERE. A join's delta can be
    empty although its tables changed (rows without partners): the state still advanced over
    a real delta, which ``Pipeline.applied`` (and so the maintenance counters) must show.
    Needless for one table: each such row makes a row of :func:`query`."""
    exists = [_has_delta(conn, t, info) for t, info in zip(spec.tables, infos, strict=True)]
    return _reading(conn, infos, sql.SQL("SELECT {}").format(sql.SQL(" OR ").join(exists)))


def _term(conn: Conn, spec: PlanSpec, infos: Sequence[deltas.TableInfo],
          changed: tuple[int, ...]) -> sql.Composable:
    """``SELECT _g…, _f…, _a…, _w, _bad`` of ``⋈_{i∈changed} ΔTi ⋈_{others} Ti'``."""
    items: list[sql.Composable] = []
    conds: list[sql.Composable] = []
    for pos, (t, info) in enumerate(zip(spec.tables, infos, strict=True)):
        alias = deltas.escaped(conn, sql.Identifier(t.alias))
        if pos in changed:
            source = deltas.escaped(conn, deltas.audit_source(info))
            conds.append(deltas.param_delta_filter(conn, t.alias))
            if len(spec.tables) > 1:
                conds.append(_has_delta(conn, t, info))
        else:
            source = _text(t.source)
        items.append(sql.SQL("{} AS {}").format(source, alias))
        conds += [sql.SQL("({})").format(_text(w)) for w in t.where]
    conds += [sql.SQL("{} = {}").format(_text(x), _text(y)) for _a, x, _b, y in spec.equalities]
    mults = [deltas.escaped(conn, sql.Identifier(spec.tables[p].alias, "_mult")) for p in changed]
    sign = "" if len(changed) % 2 else "-1 * "
    select: list[sql.Composable] = [
        sql.SQL("{} AS {}").format(_text(g), sql.Identifier(f"_g{i}"))
        for i, g in enumerate(spec.group_sql)]
    select += [sql.SQL("{} AS {}").format(_text(t.fragment or ""), sql.Identifier(f"_f{i}"))
               for i, t in enumerate(_sketched(spec))]
    select += [sql.SQL("{} AS {}").format(_text(arg or "TRUE"), sql.Identifier(f"_a{i}"))
               for i, arg in enumerate(spec.agg_sql)]
    select.append(sql.SQL(sign) + sql.SQL(" * ").join(mults) + sql.SQL(" AS _w"))
    select.append(sql.SQL(" OR ").join(sql.SQL("{} NOT IN (1, -1)").format(m) for m in mults)
                  + sql.SQL(" AS _bad"))
    return sql.SQL("SELECT {} FROM {} WHERE {}").format(
        sql.SQL(", ").join(select), sql.SQL(", ").join(items), sql.SQL(" AND ").join(conds))


_COUNT, _SUMS, _SUM = 0, 1, 2


def parse(spec: PlanSpec, rows: Sequence[tuple[Any, ...]],
          layout: Layout = Layout()) -> tuple[list[Partial], list[ValueChange]]:
    """The rows of :func:`query` (built with ``layout``) as ``Aggregate.step_partials``
    input."""
    slots = [t.slot for t in _sketched(spec)]
    valued = _valued(spec)
    ng, nv = len(spec.group_sql), len(valued)
    at_v = ng + len(slots)
    at0 = at_v + 2 * nv
    frag_cols = [(s, ng + k) for k, s in enumerate(slots) if s is not None]
    # (first column or -1 for min/max, its kind: _COUNT, _SUMS (split by sign) or _SUM)
    columns: list[tuple[int, int]] = []
    at = at0 + 1
    for i, a in enumerate(spec.aggs):
        if a.func in ("min", "max"):
            columns.append((-1, _COUNT))
        elif i in layout.integer:
            columns.append((at, _SUM))
            at += 2
        elif a.func in ("sum", "avg"):
            columns.append((at, _SUMS))
            at += 4
        else:
            columns.append((at, _COUNT))
            at += 1
    out: list[Partial] = []
    values: list[ValueChange] = []
    one = frag_cols[0] if len(frag_cols) == 1 else None
    for r in rows:
        if r[-1]:
            raise InconsistentDelta("audit rows with a multiplicity other than ±1")
        if nv and 0 in r[at_v + nv:at0]:
            j = r[at_v + nv:at0].index(0)
            values.append((r[:ng], valued[j], r[at_v + j], r[at0]))
            continue
        parts: list[object] = []
        for c, kind in columns:   # a loop, not a comprehension: no call per row
            if c < 0:
                parts.append(None)
            elif kind == _SUM:
                parts.append((r[c], r[c + 1]))
            elif kind == _SUMS:
                pos, neg = r[c], r[c + 1]
                if pos is None:
                    pos = 0
                if neg is None:
                    neg = 0
                change = (pos - neg if type(pos) is int and type(neg) is int
                          else finite_difference(pos, neg))
                fixed = r[c + 3]
                parts.append((change, r[c + 2]) if fixed is None
                             else (change, r[c + 2], fixed))
            else:
                parts.append(r[c])
        frags = (((one[0], r[one[1]]),) if one is not None
                 else tuple([(s, r[c]) for s, c in frag_cols]))
        out.append((r[:ng], frags, r[at0], parts))
    return out, values
