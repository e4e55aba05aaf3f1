"""Per-group running values of the aggregate functions (IMP §5.2.5–5.2.6, §7.2).

* count(x) / count(*): the number of (non-NULL) inputs.
* sum(x), avg(x): the running sum and the non-NULL count; sum of no values is NULL, avg is
  ``sum / count`` with PostgreSQL's numeric division (:func:`pg_numeric_div`) for int/numeric
  input, so HAVING/ORDER BY compare the value PostgreSQL compares.
* min(x), max(x): a sorted multiset value → multiplicity, optionally bounded to the best
  ``limit`` distinct values (:class:`ValueBuffer`).

Every accumulator takes signed weights: ``add(v, +m)`` inserts ``m`` copies, ``add(v, −m)``
deletes them; deleting what is not there raises :class:`InconsistentDelta`.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from fractions import Fraction
from operator import itemgetter
from typing import Any, cast

from sortedcontainers import SortedDict

from sketches.ivm import numeric
from sketches.ivm.codec import Json, decode_value, encode_value
from sketches.ivm.errors import InconsistentDelta, NotMaintainable, StateFormatError

FUNCTIONS = ("count_star", "count", "sum", "avg", "min", "max")

_NBASE = 10_000


def _pg_weight(value: Fraction) -> tuple[int, int]:
    """(weight, first digit) of a non-zero value in PostgreSQL's base-10000 numeric format."""
    a = abs(value)
    w = 0
    while a >= _NBASE ** (w + 1):
        w += 1
    while a < Fraction(_NBASE) ** w:
        w -= 1
    return w, int(a / Fraction(_NBASE) ** w)


def _dscale(value: int | Decimal) -> int:
    if isinstance(value, int):
        return 0
    exp = value.as_tuple().exponent
    return max(0, -exp) if isinstance(exp, int) else 0


def _pg_numeric_div_fraction(total: int | Decimal, count: int) -> Decimal:
    """:func:`pg_numeric_div` through :class:`Fraction` (non-finite totals raise as before)."""
    num = Fraction(total)
    w1, d1 = _pg_weight(num) if num else (0, 0)
    w2, d2 = _pg_weight(Fraction(count))
    qweight = w1 - w2 - (1 if d1 <= d2 else 0)
    rscale = max(16 - qweight * 4, _dscale(total), 0)
    rscale = min(rscale, 1000)
    q = num / count
    scaled = abs(q) * 10 ** rscale
    digits = int(scaled)
    if scaled - digits >= Fraction(1, 2):
        digits += 1
    return Decimal((0 if q >= 0 else 1, tuple(int(c) for c in str(digits)), -rscale))


def _int_weight(n: int, scale: int) -> tuple[int, int]:
    """(weight, first base-10000 digit) of ``n / 10**scale`` for an int ``n > 0``."""
    e = len(str(n)) - 1 - scale          # floor(log10(n / 10**scale)), exactly
    w = e // 4
    shift = scale + 4 * w
    return w, (n // 10 ** shift if shift >= 0 else n * 10 ** -shift)


def pg_numeric_div(total: int | Decimal, count: int) -> Decimal:
    """``total / count`` as PostgreSQL's numeric division computes it (``avg`` of int and
    numeric inputs is exactly this): result scale from ``select_div_scale`` (at least 16
    significant digits), rounded half away from zero.

    Integer arithmetic on ``total = n / 10**scale`` (the Fraction version,
    :func:`_pg_numeric_div_fraction`, spent most of the time of avg maintenance); same result."""
    if type(total) is int and count > 0:
        return _int_div(total, count)
    if isinstance(total, Decimal):
        if not total.is_finite():
            return _pg_numeric_div_fraction(total, count)
        sign, digs, exp = total.as_tuple()
        n = int("".join(map(str, digs))) if digs else 0
        assert isinstance(exp, int)
        if exp >= 0:
            n *= 10 ** exp
            scale = 0
        else:
            scale = -exp
        negative = bool(sign) and n != 0
    else:
        n, scale = abs(total), 0
        negative = total < 0
    if count <= 0:
        return _pg_numeric_div_fraction(total, count)
    w1, d1 = _int_weight(n, scale) if n else (0, 0)
    w2, d2 = _int_weight(count, 0)
    qweight = w1 - w2 - (1 if d1 <= d2 else 0)
    rscale = min(max(16 - qweight * 4, scale, 0), 1000)
    # |q| * 10**rscale = n * 10**rscale / (count * 10**scale), rounded half up
    if rscale >= scale:
        num, den = n * 10 ** (rscale - scale), count
    else:
        num, den = n, count * 10 ** (scale - rscale)
    digits, rem = divmod(num, den)
    if 2 * rem >= den:
        digits += 1
    # from text: exact (no context rounding) and cheaper than building a digit tuple
    return Decimal(("-" if negative else "") + str(digits) + "E-" + str(rscale))


_POW10: tuple[int, ...] = tuple(10 ** i for i in range(80))


def _pow10(k: int) -> int:
    """``10 ** k`` for ``k >= 0``."""
    return _POW10[k] if k < 80 else int(10 ** k)


def _int_div(total: int, count: int) -> Decimal:
    """:func:`pg_numeric_div` for an int ``total`` and ``count > 0`` (avg of an int column):
    scale 0 drops the Decimal decoding; powers of ten come from a table."""
    n = -total if total < 0 else total
    if n:
        w1 = (len(str(n)) - 1) // 4          # floor(log10(n)) // 4
        d1 = n // _pow10(4 * w1)
    else:
        w1 = d1 = 0
    w2 = (len(str(count)) - 1) // 4
    d2 = count // _pow10(4 * w2)
    rscale = min(max(16 - (w1 - w2 - (1 if d1 <= d2 else 0)) * 4, 0), 1000)
    digits, rem = divmod(n * _pow10(rscale), count)
    if 2 * rem >= count:
        digits += 1
    return Decimal(f"-{digits}E-{rscale}" if total < 0 else f"{digits}E-{rscale}")


class CountAcc:
    __slots__ = ("nonnull",)
    nonnull: int

    def __init__(self) -> None:
        self.nonnull = 0

    def add(self, value: object, weight: int) -> None:
        if value is not None:
            self.nonnull += weight
            if self.nonnull < 0:
                raise InconsistentDelta("count below zero")

    def absorb(self, part: Any) -> None:
        """Adds a pre-aggregated change: the signed change of the non-NULL count."""
        self.nonnull += part
        if self.nonnull < 0:
            raise InconsistentDelta("count below zero")

    def result(self) -> object:
        return self.nonnull

    def snapshot(self) -> Json:
        return [self.nonnull]

    def restore(self, data: Json) -> None:
        self.nonnull = int(data[0])


class SumAcc:
    """sum/avg of one group. ``total`` and ``nonnull`` as above; for numeric (Decimal) inputs
    also what decides the *scale* of the result, which PostgreSQL takes from the values in the
    group now: its sum's display scale is the largest scale of its inputs, and avg's division
    (:func:`pg_numeric_div`) rounds to at least that scale. A running Decimal sum keeps the
    finest exponent it ever saw instead (``1 + 1.00 − 1.00`` is ``1.00``, where PostgreSQL's
    sum of the one value ``1`` is ``1``): avg of ``1, 1, 2`` after such an update compared 20
    digits of 4/3 with a 17-digit constant, not 16, and its group went missing.

    So ``scales`` counts the non-NULL values per scale — exactly for values added since the
    state was built, and for the values the build brought in when its partials are split by
    scale (avg's are: ``Pipeline._load_aggregate``); else as a *lower bound*: a pushed-down
    partial sum of one (group, fragment) only shows the largest scale among its values, so it
    counts one value at that scale. The values not counted (``nonnull − Σ scales``) have
    scales of at most ``loose`` (−1: none). The largest scale present is known when the
    largest counted one is at least ``loose`` (or ``loose`` is 0, or nothing is uncounted);
    otherwise :meth:`result` raises :class:`NotMaintainable` (the caller recaptures). Every
    count stays a lower bound under deletes: a delete at scale ``s`` lowers the count of
    ``s`` (down to 0: the rest were uncounted values, whose scale is then at most ``loose``).
    ``shown`` is the scale of ``total``'s Decimal exponent; :meth:`result` requantizes the
    total (exactly: no value present has more digits) when it differs.

    A NaN or ±Infinity entering or leaving the sum is refused (:mod:`sketches.ivm.numeric`).
    """

    __slots__ = ("total", "nonnull", "avg", "scales", "loose", "shown")
    total: Any
    nonnull: int
    avg: bool
    scales: dict[int, int] | None
    loose: int
    shown: int

    def __init__(self, avg: bool = False) -> None:
        self.total: Any = 0
        self.nonnull = 0
        self.avg = avg
        self.scales = None     # None: no Decimal input (int and float sums have no scale)
        self.loose = -1
        self.shown = 0

    def add(self, value: object, weight: int) -> None:
        if value is None:
            return
        if type(value) is Decimal:
            self._count_scale(numeric.scale(value), weight)
        elif type(value) is float:
            numeric.refuse_non_finite(value)
        self.total = numeric.add(self.total, numeric.multiply(value, weight))
        self.nonnull += weight
        if self.nonnull < 0:
            raise InconsistentDelta("sum: non-NULL count below zero")
        if self.nonnull == 0:
            self._clear()

    def absorb(self, part: Any) -> None:
        """Adds a pre-aggregated change ``(sum change, non-NULL count change)`` of values of
        one scale (``partials.query`` groups by it where it varies; the sum change has it),
        or ``(sum change, count change, s)`` when every value of the argument has scale ``s``
        (type ``numeric(p, s)``). (Two ints, the common case, are added here:
        ``numeric.add`` is a call more per group.)"""
        total, nonnull = part[0], part[1]
        mine = self.total
        if type(mine) is int and type(total) is int:
            self.total = mine + total
        else:
            if type(total) is Decimal:
                self._count_scale(numeric.scale(total), nonnull)
            elif type(total) is float:
                numeric.refuse_non_finite(total)
            self.total = numeric.add(mine, total)
        nonnull += self.nonnull
        self.nonnull = nonnull
        if nonnull <= 0:
            if nonnull < 0:
                raise InconsistentDelta("sum: non-NULL count below zero")
            self._clear()
        elif len(part) > 2 and self.loose >= 0:
            self.scales = {part[2]: nonnull}   # every value counted: all have that scale
            self.loose = -1

    def load_partial(self, total: Any, nonnull: int, scale: int | None = None) -> None:
        """Adds one partial of the state build: the sum and the non-NULL count of the values
        of one (group, fragment), computed by PostgreSQL. ``scale``: every one of those values
        has it (all are counted at it); None: unknown (the sum has the largest scale of the
        values: one is counted at it, the others are uncounted)."""
        if not nonnull:
            return
        if type(total) is Decimal and scale is not None:
            numeric.refuse_non_finite(total)
            self._count_scale(scale, int(nonnull))
        elif type(total) is Decimal:
            s = numeric.scale(total)
            self._count_scale(s, 1)
            if nonnull > 1 and s > self.loose:
                self.loose = s
        else:
            numeric.refuse_non_finite(total)
        self.total = numeric.add(self.total, total)
        self.nonnull += int(nonnull)

    def _count_scale(self, s: int, change: int) -> None:
        """``change`` values of scale ``s`` enter (> 0) or leave (< 0) the group."""
        scales = self.scales
        if scales is None:
            scales = self.scales = {}
        if s > self.shown:
            self.shown = s
        if not change:
            return
        c = scales.get(s, 0) + change
        if c > 0:
            scales[s] = c
        elif s in scales:
            del scales[s]

    def _clear(self) -> None:
        """An emptied group: drops float residue and every scale."""
        self.total = 0
        self.scales = None
        self.loose = -1
        self.shown = 0

    def _scale(self) -> int:
        """The largest scale of the values present (see the class docstring)."""
        scales = self.scales
        assert scales is not None
        top = max(scales) if scales else 0
        loose = self.loose
        if top >= loose:
            return top
        if sum(scales.values()) == self.nonnull:   # every value counted
            self.loose = -1
            return top
        raise NotMaintainable(f"sum/avg: the scale of a numeric group is unknown (at least"
                              f" {top}, at most {loose}) after deletes")

    def _shown_total(self) -> Decimal:
        """``total`` with the exponent PostgreSQL's sum of the values present has."""
        s = self._scale()
        if s < 0:   # a numeric(p, -s)'s declared scale, in a state saved before session 31
            raise NotMaintainable(f"sum/avg: a negative scale {s}")
        if s != self.shown:
            self.total = numeric.EXACT.quantize(self.total, _QUANTUM[s] if s < 80
                                                else Decimal(1).scaleb(-s))
            self.shown = s
        return cast(Decimal, self.total)

    def result(self) -> object:
        if self.nonnull == 0:
            return None
        if not self.avg:   # compared or added, a sum's value is all that counts
            return self.total
        total = self.total if self.scales is None else self._shown_total()
        if isinstance(total, float):
            return total / self.nonnull
        return pg_numeric_div(total, self.nonnull)

    def snapshot(self) -> Json:
        data = [encode_value(self.total), self.nonnull]
        if self.scales is not None:
            data += [sorted(self.scales.items()), self.loose, self.shown]
        return data

    def restore(self, data: Json) -> None:
        """Restores a :meth:`snapshot`; one of before the scales were kept (two items) counts
        no value and bounds them all by the total's scale (its finest exponent)."""
        self.total = decode_value(data[0])
        self.nonnull = int(data[1])
        self.scales, self.loose, self.shown = None, -1, 0
        if len(data) > 2:
            self.scales = {int(s): int(c) for s, c in data[2]}
            self.loose, self.shown = int(data[3]), int(data[4])
        elif type(self.total) is Decimal and self.nonnull:
            if not self.total.is_finite():
                raise StateFormatError(f"sum state {self.total!r} is not finite")
            self.scales = {}
            self.loose = self.shown = numeric.scale(self.total)


_QUANTUM: tuple[Decimal, ...] = tuple(Decimal(1).scaleb(-s) for s in range(80))
"""``1E-s``: the exponent a total of scale ``s`` is quantized to."""


def _check_orderable(value: object) -> None:
    """Raises :class:`NotMaintainable` for a value whose Python order is not PostgreSQL's:
    text (collations) and NaN (PostgreSQL puts it after every number; Python's comparisons of
    a NaN are false, or raise for a Decimal)."""
    if isinstance(value, (str, bytes)) or (isinstance(value, (float, Decimal))
                                           and value != value):
        raise NotMaintainable(f"min/max over {value!r} is not maintained")


def best_values(values: Iterable[tuple[Any, int]], descending: bool, limit: int | None
                ) -> tuple[list[tuple[Any, int]], bool]:
    """The best ``limit`` (all: None) of the ``(value, multiplicity)`` pairs of one group's
    min (``descending=False``) / max, best first, and whether that is all of them: what a
    :meth:`ValueBuffer.load` takes (the state build's and a refill's values, read from
    PostgreSQL). Every value is checked (:func:`_check_orderable`) before any is compared:
    sorting a Decimal NaN raised :class:`decimal.InvalidOperation`, which the manager counts
    as a bug of the engine, where a value it cannot order is a :class:`NotMaintainable`."""
    pairs = list(values)
    for v, _m in pairs:
        _check_orderable(v)
    pairs.sort(key=itemgetter(0), reverse=descending)
    if limit is None or len(pairs) <= limit:
        return pairs, True
    return pairs[:limit], False


class ValueBuffer:
    """Sorted multiset of the values of one group for min (``descending=False``) or max.

    Invariant: ``values`` holds the exact multiplicity of every value inside the *region*: all
    values when ``complete``, else the values ``v <= bound`` (min) / ``v >= bound`` (max). Values
    outside the region are not tracked (inserting or deleting them changes nothing kept), so
    while ``values`` is non-empty its first (min) / last (max) key is the true extreme.
    When ``values`` runs empty while non-NULL inputs remain, the buffer is *exhausted*.
    """

    __slots__ = ("descending", "limit", "values", "complete", "bound", "nonnull")

    def __init__(self, descending: bool, limit: int | None = None) -> None:
        if limit is not None and limit < 1:
            raise ValueError("buffer limit must be >= 1")
        self.descending = descending
        self.limit = limit
        self.values: SortedDict = SortedDict()
        self.complete = True
        self.bound: object = None
        self.nonnull = 0

    def _inside(self, value: Any) -> bool:
        if self.complete:
            return True
        return bool(value >= self.bound) if self.descending else bool(value <= self.bound)

    def add(self, value: Any, weight: int) -> None:
        if value is None or weight == 0:
            return
        _check_orderable(value)
        nonnull = self.nonnull = self.nonnull + weight
        if nonnull < 0:
            raise InconsistentDelta("min/max: non-NULL count below zero")
        values = self.values
        if nonnull == 0:
            values.clear()
            self.complete = True
            self.bound = None
            return
        if not self.complete and not (value >= self.bound if self.descending
                                      else value <= self.bound):
            return   # outside the tracked region (see _inside)
        m = values.get(value, 0) + weight
        if m < 0:
            raise InconsistentDelta(f"min/max: value {value!r} deleted more often than present")
        if m == 0:
            del values[value]
        else:
            values[value] = m

    def absorb(self, part: object) -> None:
        """A pre-aggregated delta carries no partial for min/max (None): its values come one
        by one, as net changes, through :meth:`add`."""
        if part is not None:
            raise NotMaintainable("min/max cannot absorb a pre-aggregated partial")

    def trim(self) -> None:
        """Drops the worst values beyond ``limit`` distinct values (bounded state)."""
        if self.limit is None:
            return
        while len(self.values) > self.limit:
            self.values.popitem(0 if self.descending else -1)
            self.complete = False
            self.bound = self.values.peekitem(0 if self.descending else -1)[0]

    @property
    def exhausted(self) -> bool:
        return not self.values and not self.complete and self.nonnull > 0

    def load(self, values: Iterable[tuple[object, int]], complete: bool) -> None:
        """Replaces the tracked values by an exact refill: the best values with multiplicities,
        ``complete`` when they are all of the group's values. ``nonnull`` is unchanged."""
        self.values = SortedDict()
        for v, m in values:
            if v is not None and m:
                _check_orderable(v)
                self.values[v] = self.values.get(v, 0) + m
        self.complete = complete or not self.values
        if not self.complete:
            self.bound = self.values.peekitem(0 if self.descending else -1)[0]
        else:
            self.bound = None
        if self.complete and sum(self.values.values()) != self.nonnull:
            raise InconsistentDelta("min/max refill disagrees with the group's non-NULL count")

    def result(self) -> object:
        if not self.values:
            if self.exhausted:
                raise InconsistentDelta("min/max read from an exhausted buffer")
            return None
        return self.values.peekitem(-1 if self.descending else 0)[0]

    def snapshot(self) -> Json:
        return [self.nonnull, self.complete, encode_value(self.bound),
                [[encode_value(v), m] for v, m in self.values.items()]]

    def restore(self, data: Json) -> None:
        self.nonnull = int(data[0])
        self.complete = bool(data[1])
        self.bound = decode_value(data[2])
        self.values = SortedDict({decode_value(v): int(m) for v, m in data[3]})


Accumulator = CountAcc | SumAcc | ValueBuffer


def make_accumulator(func: str, limit: int | None) -> Accumulator:
    if func in ("count", "count_star"):
        return CountAcc()
    if func in ("sum", "avg"):
        return SumAcc(avg=func == "avg")
    if func in ("min", "max"):
        return ValueBuffer(descending=func == "max", limit=limit)
    raise ValueError(f"unsupported aggregate function {func!r}")
