"""The maintenance hook of ``SketchManager`` (issue 4 plugs the incremental engine in here).

A strategy's ``refresh`` runs on the manager's connection inside the client's snapshot and
returns the sketch valid in that snapshot — the same object when nothing changed, a sketch
rebuilt with ``Sketch.with_state(parts, version)`` after incremental maintenance — or ``None``
when it cannot, and the manager then captures anew. It must never return a sketch that could
miss provenance in the current snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import psycopg

from sketches import freshness
from sketches.sketch import Sketch
from sketches.sql import QueryAnalysis


@dataclass(frozen=True, slots=True)
class MaintenanceRequest:
    """What a maintenance strategy gets besides the sketch: the analysed query, its
    parameters and the xids of the manager's own catalog-only transactions."""

    analysis: QueryAnalysis
    params: tuple[object, ...] | None
    own_xids: frozenset[int]


class MaintenanceStrategy(Protocol):
    """HOOK for the incremental engine (issue 4).

    ``refresh`` runs on the manager's connection inside the client's snapshot. It returns the
    sketch valid for that snapshot (the same object if nothing changed, or one built with
    ``Sketch.with_state(parts, version)`` after incremental maintenance), or ``None`` when it
    cannot — the manager then captures anew. It must never return a sketch that could miss
    provenance in the current snapshot."""

    name: str

    def refresh(self, conn: psycopg.Connection[Any], sketch: Sketch,
                request: MaintenanceRequest) -> Sketch | None: ...


class RecaptureOnChange:
    """Default strategy: keep the sketch iff the data provably did not change
    (``sketches.freshness.changed_since``), else recapture."""

    name = "recapture-on-change"

    def refresh(self, conn: psycopg.Connection[Any], sketch: Sketch,
                request: MaintenanceRequest) -> Sketch | None:
        if freshness.changed_since(conn, sketch.version, request.own_xids):
            return None
        return sketch
