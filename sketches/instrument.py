"""Sketch use: the client's query with the skipping predicate added.

For each sketched table the sketch's fragments are merged into maximal runs of adjacent
fragments, each run becoming a half-open range ``a >= lo AND a < hi`` (open ends omitted),
OR-ed together with ``a IS NULL`` when the NULL fragment is in the sketch, and AND-ed into the
WHERE of the SELECT that lists the table, qualified with the table's alias. Restricting a table
in the WHERE of its own SELECT is the same as replacing the table by its sketch instance,
because all joins of the supported class are inner joins.

The result is printed from the AST and re-parsed; any difference raises
InstrumentationError so the caller forwards the original SQL. Parameters (``$n``) are kept.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from sketches.lru import Lru
from sketches.sketch import SketchPart
from sketches.sql.rewrite import Range, Schemas, SkipFilter, add_skip_filters

log = logging.getLogger(__name__)


def skip_filter(part: SketchPart) -> SkipFilter:
    """The filter of one sketched table."""
    p = part.partition
    ranges = tuple(Range(*p.run_bounds(first, last)) for first, last in p.runs(part.fragments))
    return SkipFilter(part.table.scope, part.table.alias, part.column, p.type_name, ranges,
                      p.null_fragment in part.fragments)


def instrument(sql: str, parts: Sequence[SketchPart], schemas: Schemas = ()) -> str | None:
    """``sql`` with the skipping predicates of ``parts`` and its tables qualified with
    ``schemas`` (:data:`sketches.sql.rewrite.Schemas`); ``None`` when every part covers all
    of its table (nothing to skip: forward the original)."""
    useful = [p for p in parts if not p.covers_all]
    if not useful:
        return None
    filters = tuple(skip_filter(p) for p in useful)
    key = (sql, filters, schemas)
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            return hit
    text = add_skip_filters(sql, filters, schemas)  # pglast print + re-parse: milliseconds
    with _lock:
        _cache.put(key, text)
    return text


# the instrumented text is a function of the query text and its filters: a sketch whose
# fragments return to an earlier set (maintenance moving groups in and out) reuses its text
_CACHE_SIZE = 512
_cache: Lru[tuple[str, tuple[SkipFilter, ...], Schemas], str] = Lru(_CACHE_SIZE)
_lock = threading.Lock()
