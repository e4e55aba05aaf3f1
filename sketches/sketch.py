"""Provenance sketches as plain data."""

from __future__ import annotations

from dataclasses import dataclass, replace

from sketches.ranges import RangePartition
from sketches.sql.model import TableRef


@dataclass(frozen=True, slots=True)
class SketchPart:
    """The sketch of one table: fragments of ``partition`` (on ``schema.table.column``) that
    hold the table's provenance. ``table`` is the occurrence in the captured query."""

    table: TableRef
    schema: str
    column: str
    partition: RangePartition
    fragments: frozenset[int]
    nullable: bool = True

    @property
    def coverage(self) -> float:
        """Fraction of the partition's fragments in the sketch."""
        return len(self.fragments) / self.partition.fragment_count

    @property
    def covers_all(self) -> bool:
        """Skipping with this part would read every row."""
        return self.partition.covers_all(self.fragments, self.nullable)


@dataclass(frozen=True, slots=True)
class Sketch:
    """A captured (or maintained) sketch of ``query`` (with ``params``) valid for the database
    state seen by snapshot ``version`` (``pg_snapshot`` text)."""

    id: int | None
    template: str
    query: str
    params: tuple[object, ...] | None
    parts: tuple[SketchPart, ...]
    version: str
    strategy: str = "capture"

    def with_id(self, sketch_id: int) -> Sketch:
        return replace(self, id=sketch_id)

    def with_state(self, parts: tuple[SketchPart, ...], version: str) -> Sketch:
        """The same sketch brought to ``version`` (used by maintenance)."""
        return replace(self, parts=parts, version=version)

    @property
    def covers_all(self) -> bool:
        return all(p.covers_all for p in self.parts)
