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
from operator import itemgetter, methodcaller
from typing import Any, cast

from sketches.ivm.codec import Json, decode_row, encode_row
from sketches.ivm.errors import BufferExhausted, InconsistentDelta, NotMaintainable
from sketches.ivm.expr import Expr
from sketches.ivm.operator import Operator, check_kind
from sketches.ivm.ops.accumulators import (
    FUNCTIONS,
    Accumulator,
    SumAcc,
    ValueBuffer,
    make_accumulator,
)
from sketches.ivm.ops.grouptest import compile_group_test
from sketches.ivm.ops.merge import count_fragment
from sketches.ivm.zset import Ann, Row, ZSet

Refill = Callable[[Row, int], tuple[Sequence[tuple[object, int]], bool]]

_RECENT_LIMIT = 10_000   # groups whose last output row is kept (bounds the cache's memory)
_result = methodcaller("result")   # acc -> acc.result(), called from C (no comprehension frame)


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
    """``passed``: whether the group's output row passed the HAVING test when
    :meth:`Aggregate.step_sketch` last evaluated it; None when unknown (any other change)."""

    __slots__ = ("count", "frags", "accs", "passed")

    def __init__(self, slots: int, accs: list[Accumulator]) -> None:
        self.count = 0
        self.frags: list[dict[int, int]] = [{} for _ in range(slots)]
        self.accs = accs
        self.passed: bool | None = None

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
        return tuple(map(frozenset, self.frags))


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
        self._args = tuple(a.arg for a in self.aggs)
        self._key_of = _key_function(self.group_by)
        self._buffered = [i for i, a in enumerate(self.aggs) if a.func in ("min", "max")]
        # group key -> output row emitted by the last step (at most _RECENT_LIMIT groups): a
        # group touched again next step reuses it as its old row instead of recomputing every
        # result() (avg's division). Not persisted; every other state change clears it.
        self._recent: dict[Row, Row] = {}

    # -- state -------------------------------------------------------------------------------
    def _new_group(self, key: Row = ()) -> GroupState:
        """A group's empty state. A key holding NaN is refused: PostgreSQL puts every NaN in
        one group, while Python's dict would never find a NaN key again (NaN != NaN), and each
        batch would open another group (checked only here: a NaN key is always new)."""
        for v in key:
            if v != v:
                raise NotMaintainable("a NaN group key is not maintained")
        return GroupState(self.slots, [make_accumulator(a.func, self.buffer_limit)
                                       for a in self.aggs])

    def _exists(self, st: GroupState) -> bool:
        return st.count > 0 or self.scalar

    def _output(self, key: Row, st: GroupState) -> tuple[Row, Ann]:
        return key + tuple(map(_result, st.accs)), st.ann()

    def _old_output(self, key: Row, st: GroupState,
                    recent: dict[Row, Row]) -> tuple[Row, Ann] | None:
        """The group's output row before this step (None: it did not exist), taken from the
        last step's output when that emitted it (no aggregate recomputed)."""
        if st.count <= 0 and not self.scalar:
            return None
        before = recent.get(key)
        return self._output(key, st) if before is None else (before, st.ann())

    def group_key(self, row: Row) -> Row:
        return self._key_of(row)

    # -- incremental step --------------------------------------------------------------------
    def step(self, delta: ZSet) -> ZSet:
        old: dict[Row, tuple[Row, Ann] | None] = {}
        if self.scalar and not self.scalar_emitted:
            self.groups.setdefault((), self._new_group())
            old[()] = None
            self.scalar_emitted = True
        recent, self._recent = self._recent, {}   # an exception leaves no stale cache
        reann = self._apply(delta, old, recent)
        if self._buffered:
            self._settle_buffers(old)
        return self._emit(old, reann)

    def _apply(self, delta: ZSet, old: dict[Row, tuple[Row, Ann] | None],
               recent: dict[Row, Row]) -> set[Row]:
        """Adds the delta rows to their groups, first remembering the old output of each group
        in ``old`` (its row from ``recent`` when the last step emitted it); returns the groups
        whose set of fragments changed (the others keep their old annotation object: no new
        frozenset, and :class:`Merge` skips equal annotations).

        The fragment counting of :meth:`GroupState.add_frags` is inlined: a call per row was a
        good part of the cost of this loop."""
        groups, key_of, new_group = self.groups, self._key_of, self._new_group
        args = self._args
        reann: set[Row] = set()
        for (row, ann), w in delta.items():
            key = key_of(row)
            st = groups.get(key)
            if st is None:
                st = groups[key] = new_group(key)
            if key not in old:
                old[key] = self._old_output(key, st, recent)
            st.count += w
            for counter, frags in zip(st.frags, ann, strict=True):
                for f in frags:
                    c = counter.get(f, 0) + w
                    if c > 0:
                        counter[f] = c
                        if c == w:   # f appeared
                            reann.add(key)
                    elif c == 0:
                        del counter[f]
                        reann.add(key)
                    else:
                        raise InconsistentDelta(f"fragment {f} counted below zero")
            for arg, acc in zip(args, st.accs, strict=True):
                acc.add(1 if arg is None else row[arg], w)
        return reann

    def step_partials(self, rows: Iterable[Partial],
                      values: Iterable[ValueChange] = ()) -> ZSet:
        """:meth:`step` for a delta pre-aggregated in PostgreSQL: one row per (group, fragment)
        with the signed change of its row count and of each aggregate's partial (``(sum,
        non-NULL count)`` for sum/avg, the non-NULL count for count, None for min/max), and
        for min/max the net multiplicity change of each (group, value). Why: the per-row
        Python work of :meth:`step` then runs once per touched (group, fragment) and value
        instead of once per audit row. Grouped aggregates only.

        Net changes per value keep the buffers exact in any order: each value's count moves
        from one true count to another, so the non-NULL count never drops below the true
        count of the values not yet moved (see :class:`ValueBuffer`)."""
        if self.scalar:
            raise NotMaintainable("pre-aggregated deltas need GROUP BY")
        old: dict[Row, tuple[Row, Ann] | None] = {}
        recent, self._recent = self._recent, {}
        groups, new_group = self.groups, self._new_group
        reann: set[Row] = set()
        for key, frags, count, partials in rows:
            st = groups.get(key)
            if st is None:
                st = groups[key] = new_group(key)
            if key not in old:
                old[key] = self._old_output(key, st, recent)
            st.count += count
            for slot, f in frags:
                if count_fragment(st.frags[slot], f, count):
                    reann.add(key)
            for acc, part in zip(st.accs, partials, strict=True):
                acc.absorb(part)
        self._apply_values(values, old)
        return self._emit(old, reann)

    def step_sketch(self, rows: Iterable[Partial], values: Iterable[ValueChange],
                    having: HavingTest | None,
                    others: Sequence[HavingTest | None] = ()) -> list[list[dict[int, int]]]:
        """:meth:`step_partials` fused with HAVING (None: no HAVING) and the merge: returns,
        per slot, the change of each fragment's count of *passing* output rows (what
        :meth:`Merge.apply` takes) instead of a Z-set of output rows — one such list for
        ``having`` and one for each of ``others``, in that order.

        Why: for Aggregate → HAVING → Merge the old output row of a touched group matters
        only through whether it passed and its fragments. ``GroupState.passed`` remembers the
        first; the second follows from the fragments whose count crossed zero in this batch.
        So no old row is recomputed, no Z-set built, only the aggregates HAVING reads are
        computed, and a group that passes before and after with unchanged fragments costs
        nothing beyond its new row's HAVING test. Same state changes as
        :meth:`step_partials` (the tests check the sketches against it).

        ``others``: further HAVING conditions over the same aggregation (the sketches of one
        template with other thresholds, which share this state); each touched group's old and
        new output rows are computed once for all of them."""
        if self.scalar:
            raise NotMaintainable("pre-aggregated deltas need GROUP BY")
        self._recent = {}
        passes = self._pass_test(having)
        groups, new_group = self.groups, self._new_group
        before: dict[Row, bool] = {}
        old_rows: dict[Row, Row | None] = {}
        flips: dict[Row, dict[tuple[int, int], int]] = {}
        for key, frags, count, partials in rows:
            st = groups.get(key)
            if st is None:
                st = groups[key] = new_group(key)
            if key not in before:
                if st.count <= 0:
                    before[key] = False
                else:
                    passed = st.passed
                    if passed is None:
                        passed = st.passed = passes(key, st)
                    before[key] = passed
                if others:
                    old_rows[key] = (key + tuple(map(_result, st.accs))
                                     if st.count > 0 else None)
            st.count += count
            counters = st.frags
            for slot, f in frags:   # merge.count_fragment, inlined: a call per row costs
                counter = counters[slot]
                was = counter.get(f, 0)
                c = was + count
                if c > 0:
                    counter[f] = c
                    if was:
                        continue
                    flip = 1
                elif c == 0:
                    if not was:
                        continue
                    del counter[f]
                    flip = -1
                else:
                    raise InconsistentDelta(f"fragment {f} counted below zero")
                net = flips.setdefault(key, {})
                net[slot, f] = net.get((slot, f), 0) + flip
            for acc, part in zip(st.accs, partials, strict=True):
                acc.absorb(part)
        self._apply_values(values, before)
        extra = self._other_heads(old_rows, flips, others) if others else []
        return [self._passing_changes(before, flips, passes), *extra]

    def _other_heads(self, old_rows: dict[Row, Row | None],
                     flips: dict[Row, dict[tuple[int, int], int]],
                     others: Sequence[HavingTest | None]) -> list[list[dict[int, int]]]:
        """The passing-fragment changes of each HAVING of ``others`` (see :meth:`step_sketch`)
        from the touched groups' old rows and their state after the batch."""
        tests = [(lambda row: True) if h is None else h[0] for h in others]
        out: list[list[dict[int, int]]] = [[{} for _ in range(self.slots)] for _ in others]
        groups = self.groups
        for key, old in old_rows.items():
            st = groups[key]
            new = key + tuple(map(_result, st.accs)) if st.count > 0 else None
            net = flips.get(key)
            for test, changes in zip(tests, out, strict=True):
                was = old is not None and test(old) is True
                now = new is not None and test(new) is True
                _count_passing(changes, st, net, was, now)
        return out

    def _apply_values(self, values: Iterable[ValueChange], touched: dict[Row, Any]) -> None:
        """The min/max value changes of a pre-aggregated delta (groups ``touched`` by its
        rows), then the buffers settled (refilled where they ran dry)."""
        groups = self.groups
        for key, i, value, weight in values:
            st = groups.get(key)
            if st is None or key not in touched:
                raise InconsistentDelta(f"value change of group {key!r} without its rows")
            st.accs[i].add(value, weight)
        if self._buffered:
            self._settle_buffers(touched)

    def _pass_test(self, having: HavingTest | None) -> Callable[[Row, GroupState], bool]:
        """``(key, state) -> bool`` for a group with an output row (``count > 0``): its row
        passes ``having`` (None: every row passes). Computed, not read from ``state.passed``:
        the callers keep that cache themselves (a call less per group). On the accumulators
        (:mod:`sketches.ivm.ops.grouptest`) when the predicate allows, else on an output row
        with placeholders for the aggregates the test does not read."""
        if having is None:
            return lambda key, st: True
        test, cols, predicate = having
        width = len(self.group_by)
        on_group = compile_group_test(predicate, width, [a.func for a in self.aggs])
        if on_group is not None:
            return lambda key, st: on_group((key, st.accs)) is True
        needed = [width + i in cols for i in range(len(self.aggs))]
        if all(needed):
            def results(accs: list[Accumulator]) -> tuple[object, ...]:
                return tuple(map(_result, accs))
        else:
            def results(accs: list[Accumulator]) -> tuple[object, ...]:
                return tuple([a.result() if n else None for a, n in zip(accs, needed, strict=True)])
        return lambda key, st: test(key + results(st.accs)) is True

    def _passing_changes(self, before: dict[Row, bool],
                         flips: dict[Row, dict[tuple[int, int], int]],
                         passes: Callable[[Row, GroupState], bool]) -> list[dict[int, int]]:
        changes: list[dict[int, int]] = [{} for _ in range(self.slots)]
        groups = self.groups
        for key, was in before.items():
            st = groups[key]
            count = st.count
            if count <= 0:
                if count < 0:
                    raise InconsistentDelta(f"group {key!r} counted below zero")
                if any(st.frags):
                    raise InconsistentDelta(f"empty group {key!r} still counts fragments")
                del groups[key]
                if was:
                    _count_passing(changes, st, flips.get(key), was, False)
                continue
            now = st.passed = passes(key, st)
            if was or now:
                _count_passing(changes, st, flips.get(key), was, now)
        return changes

    def _emit(self, old: dict[Row, tuple[Row, Ann] | None], reann: set[Row]) -> ZSet:
        """``−old row +new row`` of every touched group (built as a dict: identical pairs
        cancel); drops groups that became empty."""
        out: dict[tuple[Row, Ann], int] = {}
        groups, scalar = self.groups, self.scalar
        recent: dict[Row, Row] = {}
        for key, before in old.items():
            st = groups[key]
            st.passed = None
            if st.count < 0:
                raise InconsistentDelta(f"group {key!r} counted below zero")
            if st.count > 0 or scalar:
                ann = before[1] if before is not None and key not in reann else st.ann()
                after = (key + tuple(map(_result, st.accs)), ann)
                recent[key] = after[0]
                if before is None:
                    out[after] = 1
                elif after != before:
                    out[before] = -1
                    out[after] = out.get(after, 0) + 1
            else:
                if any(st.frags):
                    raise InconsistentDelta(f"empty group {key!r} still counts fragments")
                del groups[key]
                if before is not None:
                    out[before] = -1
        if len(recent) <= _RECENT_LIMIT:
            self._recent = recent
        return ZSet.from_dict({k: w for k, w in out.items() if w})

    def _settle_buffers(self, touched: Iterable[Row]) -> None:
        dry: list[tuple[Row, int]] = []
        groups, buffered = self.groups, self._buffered
        for key in touched:
            accs = groups[key].accs
            for i in buffered:
                buf = cast(ValueBuffer, accs[i])
                if buf.exhausted:
                    dry.append((key, i))
                else:
                    buf.trim()
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
        sum/avg, or ``(sum, non-NULL count, scale)`` when all its values have that scale (None:
        unknown). min/max values are loaded afterwards by :meth:`load_values`."""
        self._recent = {}
        st = self.groups.get(key)
        if st is None:
            st = self.groups[key] = self._new_group(key)
        st.count += count
        st.passed = None
        st.add_frags(((s, f) for s, f in enumerate(frags) if f is not None), count)
        for acc, part in zip(st.accs, partials, strict=True):
            if isinstance(acc, SumAcc):
                acc.load_partial(*cast(tuple[Any, int, int | None], part))
            else:
                acc.nonnull += int(cast(int, part))

    def load_values(self, key: Row, agg_index: int, values: Sequence[tuple[object, int]],
                    complete: bool) -> None:
        self._recent = {}
        st = self.groups[key]
        st.passed = None
        acc = st.accs[agg_index]
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
        self._recent = {}
        for key, count, frags, accs in state["groups"]:
            st = self._new_group()
            st.count = int(count)
            st.frags = [{int(f): int(c) for f, c in slot} for slot in frags]
            for acc, data in zip(st.accs, accs, strict=True):
                acc.restore(data)
            self.groups[decode_row(key)] = st


def _count_passing(changes: list[dict[int, int]], st: GroupState,
                   net: dict[tuple[int, int], int] | None, was: bool, now: bool) -> None:
    """Adds one group's change to ``changes`` (per slot: fragment → change of its count of
    passing rows): it passed before the batch (``was``) and/or after it (``now``); ``st``
    is its state after the batch, ``net`` its fragments' net appearances (+1) and
    disappearances (−1) in the batch."""
    if was and now:
        if net:
            for (slot, f), d in net.items():
                if d:
                    ch = changes[slot]
                    ch[f] = ch.get(f, 0) + d
    elif was:
        for slot, f in _fragments_before(st, net):
            ch = changes[slot]
            ch[f] = ch.get(f, 0) - 1
    elif now:
        for slot, counter in enumerate(st.frags):
            ch = changes[slot]
            for f in counter:
                ch[f] = ch.get(f, 0) + 1


def _fragments_before(st: GroupState,
                      net: dict[tuple[int, int], int] | None) -> list[tuple[int, int]]:
    """(slot, fragment) pairs of the group's fragments before the batch whose net fragment
    appearances (+1) and disappearances (−1) are ``net``."""
    out = [(slot, f) for slot, counter in enumerate(st.frags) for f in counter
           if not net or net.get((slot, f), 0) <= 0]
    if net:
        out += [sf for sf, d in net.items() if d < 0]
    return out


def _key_function(cols: tuple[int, ...]) -> Callable[[Row], Row]:
    """``row -> tuple(row[i] for i in cols)`` without a generator per row."""
    if not cols:
        return lambda row: ()
    if len(cols) == 1:
        col = cols[0]
        return lambda row: (row[col],)
    return cast(Callable[[Row], Row], itemgetter(*cols))


Partial = tuple[Row, Sequence[tuple[int, int]], int, Sequence[object]]
"""A pre-aggregated delta row: group key, ``(slot, fragment)`` pairs, row-count change, one
partial change per aggregate (see :meth:`Aggregate.step_partials`)."""

HavingTest = tuple[Callable[[Row], object], frozenset[int], Expr]
"""HAVING as a function of an output row (True, False or None), the positions it reads, and
the predicate itself."""

ValueChange = tuple[Row, int, object, int]
"""Group key, index of a min/max aggregate, a value, its net multiplicity change."""

