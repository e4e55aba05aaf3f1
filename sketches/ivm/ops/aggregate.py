"""Aggregation γ_{G; f1(x1), …} with count, sum, avg, min, max (IMP §5.2.5–5.2.6, §7.1–7.2).

State per group ``g``: ``count`` (total input multiplicity), one accumulator per aggregate
(:mod:`sketches.ivm.ops.accumulators`) and the fragment counter ``F_g[slot][f]`` = the number of
the group's input tuples whose annotation contains ``f``; the group's sketch is
``P_g = {f | F_g[f] > 0}`` per slot.

Delta rule. For a batch ``ΔR`` let ``G_Δ`` be the groups it touches. Every other group's output
row and ``P_g`` are unchanged. For ``g ∈ G_Δ``: ``count' = count + Σ m``, each accumulator adds
``m·x`` (resp. value multiplicities), ``F_g'[f] = F_g[f] + Σ_{(t,P,m) ∈ ΔR_g, f ∈ P} m``. The
output relation changes exactly by replacing the group's old row by its new one, hence emit
``(old row, P_g, −1)`` if the group existed (count > 0) and ``(new row, P_g', +1)`` if it still
exists (count' > 0): once per batch, not once per input tuple (old outputs are remembered the
first time a batch touches the group). A pair that is identical cancels in the Z-set.

A scalar aggregate (no GROUP BY) always has exactly one output row, also over empty input.

Bounded min/max buffers: with ``buffer_limit`` only the best ``l`` distinct values per group are
kept. When a batch exhausts a buffer (values run out while non-NULL inputs remain), the operator
asks ``refill(group key, aggregate index)`` for the exact best values of the *current* input (the
caller queries PostgreSQL in the maintenance snapshot); without a refill callback it raises
:class:`BufferExhausted`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sketches.ivm.codec import Json, decode_row, encode_row
from sketches.ivm.errors import BufferExhausted, InconsistentDelta
from sketches.ivm.operator import Operator, check_kind
from sketches.ivm.ops.accumulators import (
    FUNCTIONS,
    Accumulator,
    SumAcc,
    ValueBuffer,
    make_accumulator,
)
from sketches.ivm.zset import Ann, Row, ZSet

Refill = Callable[[Row, int], tuple[Sequence[tuple[object, int]], bool]]


@dataclass(frozen=True, slots=True)
class AggSpec:
    """``func`` over input column ``arg`` (``None`` for count(*))."""

    func: str
    arg: int | None = None

    def __post_init__(self) -> None:
        if self.func not in FUNCTIONS:
            raise ValueError(f"unsupported aggregate function {self.func!r}")
        if (self.arg is None) != (self.func == "count_star"):
            raise ValueError(f"{self.func} needs an argument column (only count_star has none)")


class GroupState:
    __slots__ = ("count", "frags", "accs")

    def __init__(self, slots: int, accs: list[Accumulator]) -> None:
        self.count = 0
        self.frags: list[dict[int, int]] = [{} for _ in range(slots)]
        self.accs = accs

    def add_frags(self, frags: Iterable[tuple[int, int]], weight: int) -> None:
        for slot, f in frags:
            counter = self.frags[slot]
            c = counter.get(f, 0) + weight
            if c < 0:
                raise InconsistentDelta(f"fragment {f} of slot {slot} counted below zero")
            if c:
                counter[f] = c
            else:
                del counter[f]

    def ann(self) -> Ann:
        return tuple(frozenset(c) for c in self.frags)


class Aggregate(Operator):
    kind = "aggregate"

    def __init__(self, group_by: Sequence[int], aggs: Sequence[AggSpec], slots: int,
                 scalar: bool = False, buffer_limit: int | None = None,
                 refill: Refill | None = None) -> None:
        if scalar and group_by:
            raise ValueError("a scalar aggregate has no group-by columns")
        self.group_by = tuple(group_by)
        self.aggs = tuple(aggs)
        self.slots = slots
        self.scalar = scalar
        self.buffer_limit = buffer_limit
        self.refill = refill
        self.groups: dict[Row, GroupState] = {}
        self.scalar_emitted = False

    # -- state -------------------------------------------------------------------------------
    def _new_group(self) -> GroupState:
        return GroupState(self.slots, [make_accumulator(a.func, self.buffer_limit)
                                       for a in self.aggs])

    def _exists(self, st: GroupState) -> bool:
        return st.count > 0 or self.scalar

    def _output(self, key: Row, st: GroupState) -> tuple[Row, Ann]:
        return key + tuple([acc.result() for acc in st.accs]), st.ann()

    def group_key(self, row: Row) -> Row:
        return tuple(row[i] for i in self.group_by)

    # -- incremental step --------------------------------------------------------------------
    def step(self, delta: ZSet) -> ZSet:
        old: dict[Row, tuple[Row, Ann] | None] = {}
        if self.scalar and not self.scalar_emitted:
            self.groups.setdefault((), self._new_group())
            old[()] = None
            self.scalar_emitted = True
        groups, group_by = self.groups, self.group_by
        args = [a.arg for a in self.aggs]
        for row, ann, w in delta:
            key = tuple([row[i] for i in group_by])
            st = groups.get(key)
            if st is None:
                st = groups[key] = self._new_group()
            if key not in old:
                old[key] = self._output(key, st) if self._exists(st) else None
            st.count += w
            st.add_frags([(s, f) for s, fs in enumerate(ann) for f in fs], w)
            for arg, acc in zip(args, st.accs, strict=True):
                acc.add(1 if arg is None else row[arg], w)
        self._settle_buffers(old)
        out = ZSet()
        for key, before in old.items():
            st = self.groups[key]
            if st.count < 0:
                raise InconsistentDelta(f"group {key!r} counted below zero")
            if before is not None:
                out.add(before[0], before[1], -1)
            if self._exists(st):
                out.add(*self._output(key, st), 1)
            else:
                if any(st.frags):
                    raise InconsistentDelta(f"empty group {key!r} still counts fragments")
                del self.groups[key]
        return out

    def _settle_buffers(self, touched: Iterable[Row]) -> None:
        dry: list[tuple[Row, int]] = []
        for key in touched:
            for i, acc in enumerate(self.groups[key].accs):
                if isinstance(acc, ValueBuffer):
                    if acc.exhausted:
                        dry.append((key, i))
                    else:
                        acc.trim()
        if not dry:
            return
        if self.refill is None:
            raise BufferExhausted(self.kind, [k for k, _ in dry])
        for key, i in dry:
            values, complete = self.refill(key, i)
            acc = self.groups[key].accs[i]
            assert isinstance(acc, ValueBuffer)
            acc.load(values, complete)
            acc.trim()
            if acc.exhausted:
                raise BufferExhausted(self.kind, [key])

    # -- state building at capture (pushed-down partial aggregates) ---------------------------
    def absorb_partial(self, key: Row, frags: Sequence[int | None], count: int,
                       partials: Sequence[object]) -> None:
        """Adds one row of ``SELECT g, frag…, count(*), partials… GROUP BY g, frag…``:
        ``partials[i]`` is the non-NULL count for count/min/max and ``(sum, non-NULL count)`` for
        sum/avg. min/max values are loaded afterwards by :meth:`load_values`."""
        st = self.groups.get(key)
        if st is None:
            st = self.groups[key] = self._new_group()
        st.count += count
        st.add_frags(((s, f) for s, f in enumerate(frags) if f is not None), count)
        for acc, part in zip(st.accs, partials, strict=True):
            if isinstance(acc, SumAcc):
                total, nonnull = cast(tuple[Any, int], part)
                if nonnull:
                    acc.total = acc.total + total
                    acc.nonnull += int(nonnull)
            else:
                acc.nonnull += int(cast(int, part))

    def load_values(self, key: Row, agg_index: int, values: Sequence[tuple[object, int]],
                    complete: bool) -> None:
        acc = self.groups[key].accs[agg_index]
        if not isinstance(acc, ValueBuffer):
            raise TypeError(f"aggregate {agg_index} is not min/max")
        acc.load(values, complete)
        acc.trim()

    def current_output(self) -> ZSet:
        """All current output rows with weight +1 (seeds the operators above after a load)."""
        if self.scalar:
            self.groups.setdefault((), self._new_group())
            self.scalar_emitted = True
        return ZSet((*self._output(k, st), 1) for k, st in self.groups.items()
                    if self._exists(st))

    # -- persistence ---------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Json]:
        return {
            "kind": self.kind,
            "scalar_emitted": self.scalar_emitted,
            "groups": [[encode_row(k), st.count,
                        [sorted(c.items()) for c in st.frags],
                        [acc.snapshot() for acc in st.accs]]
                       for k, st in self.groups.items()],
        }

    def restore(self, state: dict[str, Json]) -> None:
        check_kind(self.kind, state)
        self.scalar_emitted = bool(state["scalar_emitted"])
        self.groups = {}
        for key, count, frags, accs in state["groups"]:
            st = self._new_group()
            st.count = int(count)
            st.frags = [{int(f): int(c) for f, c in slot} for slot in frags]
            for acc, data in zip(st.accs, accs, strict=True):
                acc.restore(data)
            self.groups[decode_row(key)] = st
