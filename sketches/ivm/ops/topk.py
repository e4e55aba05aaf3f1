"""Top-k τ_{k,O} (IMP §5.2.7, §7.2), with ties.

State: an ordered map ``O-key → {(tuple, P): multiplicity}`` (a :class:`SortedDict`).

Output: the first ``k`` tuples in O-order *and every tuple tied with the k-th one* (``FETCH FIRST
k ROWS WITH TIES``). PostgreSQL breaks ties arbitrarily; keeping all tied tuples makes the sketch
independent of that choice (an over-approximation of the provenance of any tie-break, hence
still sufficient). Bag semantics: a tuple of multiplicity m counts m times towards k.

Delta rule: with ``top(S)`` the output for state S, ``Δτ = top(S + ΔS) − top(S)``. The operator
computes the old top (walking the map from the start until k is reached, O(k)), applies the
batch, computes the new top and emits ``−old +new`` only when they differ (consolidated).

Bounded state (``buffer_limit = l >= k``): the map keeps only the tuples whose O-key is ``<=
bound`` (all of them when ``complete``); tuples beyond the bound are not tracked, inserting or
deleting them changes nothing kept. After a batch the map is trimmed back to about ``l`` tuples
(whole O-keys only). When deletions leave fewer than ``k`` tracked tuples while the buffer is
incomplete, the top can no longer be known: ``refill()`` must return the exact top-``l`` (with
ties) of the current input, or :class:`BufferExhausted` is raised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from operator import itemgetter
from typing import Any

from sortedcontainers import SortedDict

from sketches.ivm.codec import Json, decode_ann, decode_row, encode_ann, encode_row
from sketches.ivm.errors import BufferExhausted, InconsistentDelta, NotMaintainable
from sketches.ivm.operator import Operator, check_kind
from sketches.ivm.zset import Ann, Entry, Row, ZSet

TopRefill = Callable[[], tuple[Sequence[Entry], bool]]


@dataclass(frozen=True, slots=True)
class OrderItem:
    """ORDER BY column ``col``; ``nulls_first=None`` is PostgreSQL's default (NULLS LAST for
    ASC, NULLS FIRST for DESC)."""

    col: int
    descending: bool = False
    nulls_first: bool | None = None

    @property
    def nulls_go_first(self) -> bool:
        return self.descending if self.nulls_first is None else self.nulls_first


class _Desc:
    """Reverses the order of a value."""

    __slots__ = ("v",)

    def __init__(self, v: Any) -> None:
        self.v = v

    def __lt__(self, other: _Desc) -> bool:
        return bool(other.v < self.v)

    def __le__(self, other: _Desc) -> bool:
        return bool(other.v <= self.v)

    def __gt__(self, other: _Desc) -> bool:
        return bool(other.v > self.v)

    def __ge__(self, other: _Desc) -> bool:
        return bool(other.v >= self.v)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and bool(self.v == other.v)

    def __hash__(self) -> int:
        return hash(self.v)


def order_key(row: Row, order: Sequence[OrderItem]) -> tuple[object, ...]:
    """The sort key of ``row``. Only types whose Python order is PostgreSQL's are accepted
    (numbers, dates, times, booleans): text order depends on the collation."""
    parts: list[object] = []
    for item in order:
        v = row[item.col]
        if isinstance(v, str | bytes) or (isinstance(v, float | Decimal) and v != v):
            raise NotMaintainable(f"ORDER BY on {type(v).__name__} values is not maintained")
        if v is None:
            parts.append((0 if item.nulls_go_first else 2, 0))
        elif item.descending:
            parts.append((1, _desc(v)))
        else:
            parts.append((1, v))
    return tuple(parts)


def order_key_function(order: Sequence[OrderItem]) -> Callable[[Row], tuple[object, ...]]:
    """:func:`order_key` bound to ``order``: the per-item attributes (and the NULLs-first
    property) are looked up once, not once per row."""
    items = [(item.col, item.descending, (0 if item.nulls_go_first else 2, 0)) for item in order]

    def key(row: Row) -> tuple[object, ...]:
        parts: list[object] = []
        for col, descending, null_part in items:
            v = row[col]
            if v is None:
                parts.append(null_part)
                continue
            if isinstance(v, str | bytes) or (isinstance(v, float | Decimal) and v != v):
                raise NotMaintainable(f"ORDER BY on {type(v).__name__} values is not maintained")
            parts.append((1, _desc(v) if descending else v))
        return tuple(parts)
    return key


def _desc(v: Any) -> object:
    """A key ordering like ``v`` reversed. Numbers are negated exactly (int, float without NaN,
    finite or infinite Decimal via ``copy_negate``, which never rounds): comparing them is C code,
    where :class:`_Desc` costs a Python call per comparison. A column holds one kind of value
    (numbers or not), so negated and wrapped keys never meet."""
    t = type(v)
    if t is int or t is float:
        return -v
    if t is Decimal:
        return v.copy_negate()
    return _Desc(v)


def best_with_ties(z: ZSet, order: Sequence[OrderItem],
                   limit: int) -> tuple[list[Entry], bool]:
    """The first ``limit`` tuples of ``z`` (by multiplicity) in O-order plus every tuple tied
    with the last of them, and whether that is all of ``z``: a :meth:`TopK.load` of exact
    data computed in memory."""
    key = order_key_function(order)
    ranked = sorted(((key(r), (r, a, w)) for r, a, w in z), key=itemgetter(0))
    out: list[Entry] = []
    taken, last = 0, None
    for okey, entry in ranked:
        if taken >= limit and okey != last:
            break
        out.append(entry)
        taken += entry[2]
        last = okey
    return out, len(out) == len(ranked)


def top_with_ties(entries: Iterable[tuple[object, dict[tuple[Row, Ann], int]]],
                  k: int) -> ZSet:
    """The first k tuples (by multiplicity) of ``(O-key, bucket)`` pairs in O-order, plus every
    tuple tied with the k-th."""
    out = ZSet()
    taken = 0
    for _okey, bucket in entries:
        if taken >= k:
            break
        for (row, ann), m in bucket.items():
            out.add(row, ann, m)
            taken += m
    return out


class TopK(Operator):
    kind = "topk"

    def __init__(self, order: Sequence[OrderItem], k: int, buffer_limit: int | None = None,
                 refill: TopRefill | None = None) -> None:
        if k < 1:
            raise ValueError("k must be >= 1")
        if buffer_limit is not None and buffer_limit < k:
            raise ValueError("the top-k buffer must keep l >= k tuples")
        self.order = tuple(order)
        self.k = k
        self.buffer_limit = buffer_limit
        self.refill = refill
        self.entries: SortedDict = SortedDict()    # O-key -> {(row, ann): multiplicity}
        self.total = 0
        self.complete = True
        self.bound_row: Row | None = None          # a row whose O-key is the bound
        self.need = k
        """Tuples the map must hold unless complete (refilled below): ``k``, or more when other
        sketches read a larger top from it (``Pipeline.add_head``); at most ``buffer_limit``."""
        self._okey = order_key_function(self.order)
        self._bound_of: Row | None = None          # the row _bound_key was computed from
        self._bound_key: tuple[object, ...] = ()

    def _bound(self) -> tuple[object, ...] | None:
        """The O-key beyond which tuples are not tracked; None when the map is complete."""
        if self.complete:
            return None
        bound = self.bound_row
        assert bound is not None
        if bound is not self._bound_of:   # the bound's O-key, computed once per bound row
            self._bound_key, self._bound_of = self._okey(bound), bound
        return self._bound_key

    def top(self, k: int | None = None) -> ZSet:
        """The output: the first ``k`` tuples (default: the operator's own ``k``) with ties;
        exact for any ``k <= need``."""
        return top_with_ties(self.entries.items(), self.k if k is None else k)

    def step(self, delta: ZSet, project: Callable[[Row], Row] | None = None) -> ZSet:
        """The delta rule above; ``project`` maps each delta row first (the ORDER BY
        projection under the top-k, applied here instead of building its Z-set). It must not
        map two rows of one delta to the same row (the pipeline's keeps every column)."""
        before = self.top()
        self._add_all(delta, project)
        if not self.complete and self.total < self.need:
            if self.refill is None:
                raise BufferExhausted(self.kind, [()])
            self.load(*self.refill())
            if not self.complete and self.total < self.need:
                raise BufferExhausted(self.kind, [()])
        self._trim()
        after = self.top()
        return after - before if after != before else ZSet()

    def _add_all(self, entries: Iterable[Entry],
                 project: Callable[[Row], Row] | None = None) -> None:
        """Adds each ``(row, ann, weight)`` (its row mapped by ``project``) whose O-key is
        within the bound; tuples beyond it are not tracked. One loop for all: for most rows
        of a large delta the O-key is all the work (the bound moves only in :meth:`_trim`
        and :meth:`load`, never while adding)."""
        okey_of, tracked = self._okey, self.entries
        bound = self._bound()
        total = self.total
        for row, ann, w in entries:
            if project is not None:
                row = project(row)
            okey = okey_of(row)
            if bound is not None and not okey <= bound:
                continue
            bucket = tracked.get(okey)
            if bucket is None:
                bucket = tracked[okey] = {}
            m = bucket.get((row, ann), 0) + w
            if m > 0:
                bucket[(row, ann)] = m
            elif m == 0:
                del bucket[(row, ann)]
                if not bucket:
                    del tracked[okey]
            else:
                self.total = total
                raise InconsistentDelta(f"top-k: tuple {row!r} deleted more often than present")
            total += w
        self.total = total

    def _trim(self) -> None:
        if self.buffer_limit is None:
            return
        while len(self.entries) > 1:
            last_key, last = self.entries.peekitem(-1)
            size = sum(last.values())
            if self.total - size < self.buffer_limit:
                break
            self.entries.popitem(-1)
            self.total -= size
            self.complete = False
            _k, bucket = self.entries.peekitem(-1)
            self.bound_row = next(iter(bucket))[0]

    def load(self, entries: Iterable[Entry], complete: bool) -> None:
        """Replaces the state by exact data: ``entries`` are all input tuples whose O-key is
        ``<=`` the largest O-key among them (e.g. ``ORDER BY o FETCH FIRST l ROWS WITH TIES``);
        ``complete`` when they are the whole input."""
        self.entries = SortedDict()
        self.total = 0
        self.complete = True
        self._add_all(entries)
        self.complete = complete or not self.entries
        self.bound_row = None
        if not self.complete:
            _k, bucket = self.entries.peekitem(-1)
            self.bound_row = next(iter(bucket))[0]
        self._trim()

    def snapshot(self) -> dict[str, Json]:
        return {
            "kind": self.kind,
            "complete": self.complete,
            "bound": None if self.bound_row is None else encode_row(self.bound_row),
            "entries": [[encode_row(r), encode_ann(a), m]
                        for bucket in self.entries.values() for (r, a), m in bucket.items()],
        }

    def restore(self, state: dict[str, Json]) -> None:
        check_kind(self.kind, state)
        self.entries = SortedDict()
        self.total = 0
        self.complete = True
        self._add_all((decode_row(r), decode_ann(a), int(m)) for r, a, m in state["entries"])
        self.complete = bool(state["complete"])
        self.bound_row = None if state["bound"] is None else decode_row(state["bound"])
