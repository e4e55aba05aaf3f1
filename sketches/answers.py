"""Answers to ``prepare`` remembered by snapshot, so a repeated query needs no database.

Why it is exact: ``SketchManager.prepare`` decides from the query text, its parameters, the
search_path, the snapshot and the manager's own state. Two calls with the same text,
parameters and search_path in the same snapshot (``pg_current_snapshot()`` text: nothing
committed in between, so no write, TRUNCATE or DDL either) and with the template's sketches
unchanged reach the same sketch in the same state; only the bookkeeping (use counts) differs,
which the caller repeats. An answer is kept only for a sketch of the query's own values whose
state is at that snapshot (lazy or eager maintenance), so no catalog read, maintenance or
policy decision (a capture of its own, a recapture) was part of it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING

from sketches.lru import Lru

if TYPE_CHECKING:
    from sketches.maintained import Entry, Template

Key = tuple[str, tuple[tuple[type, object], ...] | None, str]


def query_key(sql: str, params: Sequence[object] | None
              ) -> tuple[str, tuple[tuple[type, object], ...] | None] | None:
    """A query text with its typed parameter values, as a cache key; None when a parameter
    value is unhashable. No parameters at all is one key, whether ``params`` is None (a
    simple Query) or empty (a Bind without parameters). Found: a text the proxy declined at
    first sight under the one was not found as already run under the other, and its second
    execution was declined again."""
    key = (sql, tuple(map(_param_key, params)) if params else None)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _param_key(p: object) -> tuple[type, object]:
    """A parameter's type and value; a float's or numeric's by its text. Why: Python finds
    ``Decimal('5.0') == Decimal('5')`` and ``-0.0 == 0.0``, which PostgreSQL tells apart
    where the text matters (``s = $1::text``: found, the sketch of one value answered the
    other, 3 groups instead of 10 for ``5.0`` and ``5``, none instead of 10 for ``-0.0`` and
    ``0.0``)."""
    t = type(p)
    return (t, repr(p)) if t is float or t is Decimal else (t, p)


def answer_key(sql: str, params: Sequence[object] | None, search_path: str) -> Key | None:
    """The key of a query's answer (:func:`query_key` and the search_path)."""
    key = query_key(sql, params)
    return None if key is None else (*key, search_path)


def template_state(tmpl: Template) -> tuple[tuple[int, str], ...]:
    """What of a template the choice of a sketch depends on: its sketches and their versions
    (the caller holds the template lock)."""
    return tuple((id(e), e.sketch.version) for e in tmpl.entries)


@dataclass(frozen=True, slots=True)
class Answer:
    """``entry``: weak, so a dropped sketch's state is not kept alive by its answers."""

    snapshot: str
    template: Template
    entry: weakref.ref[Entry]
    state: tuple[tuple[int, str], ...]
    strategy: str
    values: Hashable  # what ``Template.note_values`` counts for the query
    settings_free: bool = False
    """The query means the same whatever the session's TimeZone, DateStyle and IntervalStyle
    (``SketchManager.prepare``'s ``settings_differ``)."""

    def holds(self, snapshot: str, strategy_of: Callable[[Entry], str]) -> Entry | None:
        """The answer's sketch if it still answers in ``snapshot`` (the caller holds the
        template lock)."""
        entry = self.entry()
        if entry is None or snapshot != self.snapshot or strategy_of(entry) != self.strategy:
            return None
        p = entry.pipeline
        if p is None or p.broken or p.version != snapshot or entry.sketch.version != snapshot \
                or template_state(self.template) != self.state:
            return None
        return entry


class Answers:
    """A bounded map of :class:`Answer` by :func:`answer_key` (thread-safe)."""

    def __init__(self, size: int) -> None:
        self._lock = threading.Lock()
        self._answers: Lru[Key, Answer] = Lru(size)

    def remember(self, key: Key, answer: Answer) -> None:
        with self._lock:
            self._answers.put(key, answer)

    def get(self, key: Key) -> Answer | None:
        with self._lock:
            return self._answers.get(key)

    def clear(self) -> None:
        with self._lock:
            self._answers.clear()
