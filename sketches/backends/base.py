"""Execution backends: where the heavy batch work of sketches runs (DESIGN §1, issue 5).

Four operations are heavy enough to be worth moving off a single PostgreSQL backend:

* **capture** — the fragment ids, per sketched table, of the rows that produce the result of an
  analysed query with bound parameters (the same :class:`~sketches.capture.CaptureResult` as
  :func:`sketches.capture.capture`);
* **state building** — the partial aggregates ``SELECT g…, frag…, count(*), partials… GROUP BY
  g…, frag…`` that seed the incremental aggregate operator, plus the (bounded) multisets of
  min/max values (:class:`AggregateState`);
* **full maintenance** — both of the above from scratch in one snapshot (a recompute);
* **ΔR⋈S'** — the rows of a (large) table S' whose join key matches a shipped set of delta keys,
  each with S's fragment id (:meth:`ExecutionBackend.match_rows`).

Every backend computes *the same* results as the PostgreSQL one in the caller's snapshot; a
backend that cannot guarantee this for a query raises :class:`BackendUnsupported` and the router
(:mod:`sketches.backends.routing`) runs the PostgreSQL backend instead.

State row shape (the contract with ``sketches.ivm``). The aggregate operator's group key is the
tuple of GROUP BY values in ``analysis.group_by`` order (for ``SELECT DISTINCT`` without
aggregates: the select items in order). Annotation slots are the capture targets in the order
given (slot ``i`` = ``targets[i]``). Aggregates follow ``analysis.aggregates``; function names are
the ivm ones (``count_star``, ``count``, ``sum``, ``avg``, ``min``, ``max``). One
:class:`PartialRow` per ``(group, fragment…)`` combination: ``partials[j]`` is the non-NULL count
for count/min/max and ``(sum, non-NULL count)`` for sum/avg — exactly what
``Aggregate.absorb_partial`` takes. One :class:`ValueRow` per distinct non-NULL value of a min/max
argument in a group (only the best ``buffer_limit`` values when bounded: smallest for min,
largest for max); ``truncated`` lists the ``(group, aggregate)`` pairs that were cut.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg

from sketches.capture import CaptureResult, CaptureTarget
from sketches.sql.model import QueryAnalysis

Row = tuple[Any, ...]


class BackendError(Exception):
    """A backend could not run a job; the router falls back to PostgreSQL."""


class BackendUnavailable(BackendError):
    """The backend is not usable right now (not installed, still starting, failed to start,
    missing JDBC driver)."""


class BackendUnsupported(BackendError):
    """The job's query cannot be computed on this backend with PostgreSQL's exact semantics."""


class BackendJobFailed(BackendError):
    """The backend accepted the job but it failed while running."""


@dataclass(frozen=True, slots=True)
class PartialRow:
    """One row of ``GROUP BY group key, fragment ids`` (see the module docstring)."""

    key: Row
    frags: tuple[int | None, ...]
    count: int
    partials: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class ValueRow:
    """``value`` occurs ``multiplicity`` times among the non-NULL inputs of min/max aggregate
    ``aggregate`` in group ``key``."""

    key: Row
    aggregate: int
    value: Any
    multiplicity: int


class PartialSink(Protocol):
    """What :meth:`AggregateState.load_into` feeds (``sketches.ivm.ops.aggregate.Aggregate``)."""

    def absorb_partial(self, key: Row, frags: Sequence[int | None], count: int,
                       partials: Sequence[object]) -> None: ...

    def load_values(self, key: Row, agg_index: int, values: Sequence[tuple[object, int]],
                    complete: bool) -> None: ...


def _order(row: object) -> str:
    return repr(row)


@dataclass(frozen=True, slots=True)
class AggregateState:
    """The aggregate operator's state as built at capture, in a canonical row order so that
    two backends' states compare equal with ``==`` exactly when they are identical."""

    version: str
    functions: tuple[str, ...]
    slots: int
    partials: tuple[PartialRow, ...]
    values: tuple[ValueRow, ...]
    truncated: frozenset[tuple[Row, int]]
    backend: str = ""
    seconds: float = 0.0

    @classmethod
    def build(cls, version: str, functions: Sequence[str], slots: int,
              partials: Sequence[PartialRow], values: Sequence[ValueRow],
              truncated: Collection[tuple[Row, int]], backend: str,
              seconds: float) -> AggregateState:
        return cls(version, tuple(functions), slots, tuple(sorted(partials, key=_order)),
                   tuple(sorted(values, key=_order)), frozenset(truncated), backend, seconds)

    def same_as(self, other: AggregateState) -> bool:
        """Identical state (backend name, timing and version aside)."""
        return (self.functions, self.slots, self.partials, self.values, self.truncated) == (
            other.functions, other.slots, other.partials, other.values, other.truncated)

    def load_into(self, op: PartialSink) -> None:
        """Seeds an aggregate operator: every partial row, then the min/max multisets."""
        for p in self.partials:
            op.absorb_partial(p.key, p.frags, p.count, p.partials)
        grouped: dict[tuple[Row, int], list[tuple[object, int]]] = {}
        for v in self.values:
            grouped.setdefault((v.key, v.aggregate), []).append((v.value, v.multiplicity))
        for (key, agg), values in grouped.items():
            op.load_values(key, agg, values, (key, agg) not in self.truncated)


@dataclass(frozen=True, slots=True)
class FullMaintenance:
    """A recompute from scratch: the sketch and the operator state of one snapshot."""

    capture: CaptureResult
    state: AggregateState


@dataclass(frozen=True, slots=True)
class MatchRequest:
    """Rows of ``schema.table`` (``columns``, then its fragment id when ``target`` is given)
    whose ``key_columns`` equal one of the shipped keys — the S' side of ΔR⋈S'."""

    schema: str
    table: str
    columns: tuple[str, ...]
    key_columns: tuple[str, ...]
    target: CaptureTarget | None = None


class ExecutionBackend(Protocol):
    """The heavy operations. Every method runs in ``conn``'s current snapshot (a backend that
    reads through other connections imports it) and returns exactly what PostgreSQL would."""

    name: str

    def capture(self, conn: psycopg.Connection[Any], sql: str, analysis: QueryAnalysis,
                targets: Sequence[CaptureTarget],
                params: Sequence[object] | None = None) -> CaptureResult: ...

    def build_state(self, conn: psycopg.Connection[Any], analysis: QueryAnalysis,
                    targets: Sequence[CaptureTarget], params: Sequence[object] | None = None,
                    buffer_limit: int | None = None) -> AggregateState: ...

    def full_maintenance(self, conn: psycopg.Connection[Any], sql: str,
                         analysis: QueryAnalysis, targets: Sequence[CaptureTarget],
                         params: Sequence[object] | None = None,
                         buffer_limit: int | None = None) -> FullMaintenance: ...

    def match_rows(self, conn: psycopg.Connection[Any], request: MatchRequest,
                   keys: Collection[Row]) -> list[Row]: ...


AGGREGATE_FUNCTIONS = ("count_star", "count", "sum", "avg", "min", "max")


def aggregate_functions(analysis: QueryAnalysis) -> tuple[str, ...]:
    """The ivm function names of the query's aggregates; BackendUnsupported for DISTINCT
    aggregates (not incrementally maintainable)."""
    out = []
    for a in analysis.aggregates:
        if a.distinct:
            raise BackendUnsupported(f"{a.sql}: DISTINCT aggregates have no partial state")
        out.append("count_star" if a.arg is None else a.func)
    return tuple(out)
