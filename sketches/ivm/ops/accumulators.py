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
from typing import Any

from sortedcontainers import SortedDict

from sketches.ivm import numeric
from sketches.ivm.codec import Json, decode_value, encode_value
from sketches.ivm.errors import InconsistentDelta, NotMaintainable

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
    __slots__ = ("total", "nonnull", "avg")
    total: Any
    nonnull: int
    avg: bool

    def __init__(self, avg: bool = False) -> None:
        self.total: Any = 0
        self.nonnull = 0
        self.avg = avg

    def add(self, value: object, weight: int) -> None:
        if value is None:
            return
        self.total = numeric.add(self.total, numeric.multiply(value, weight))
        self.nonnull += weight
        if self.nonnull < 0:
            raise InconsistentDelta("sum: non-NULL count below zero")
        if self.nonnull == 0:
            self.total = 0   # drops float residue and Decimal exponent drift of an empty group

    def absorb(self, part: Any) -> None:
        """Adds a pre-aggregated change ``(sum change, non-NULL count change)``. (Two ints,
        the common case, are added here: ``numeric.add`` is a call more per group.)"""
        total, nonnull = part
        mine = self.total
        self.total = (mine + total if type(mine) is int and type(total) is int
                      else numeric.add(mine, total))
        nonnull += self.nonnull
        self.nonnull = nonnull
        if nonnull <= 0:
            if nonnull < 0:
                raise InconsistentDelta("sum: non-NULL count below zero")
            self.total = 0

    def result(self) -> object:
        if self.nonnull == 0:
            return None
        if not self.avg:
            return self.total
        if isinstance(self.total, float):
            return self.total / self.nonnull
        return pg_numeric_div(self.total, self.nonnull)

    def snapshot(self) -> Json:
        return [encode_value(self.total), self.nonnull]

    def restore(self, data: Json) -> None:
        self.total = decode_value(data[0])
        self.nonnull = int(data[1])


def _check_orderable(value: object) -> None:
    """Raises :class:`NotMaintainable` for a value whose Python order is not PostgreSQL's:
    text (collations) and NaN (PostgreSQL puts it after every number; Python's comparisons of
    a NaN are false, or raise for a Decimal)."""
    if isinstance(value, (str, bytes)) or (isinstance(value, (float, Decimal))
                                           and value != value):
        raise NotMaintainable(f"min/max over {value!r} is not maintained")


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
