"""A small expression language evaluated in Python with SQL's three-valued logic.

Used for HAVING predicates and ORDER BY keys over aggregate results and constants: column
references, constants, ``+ - *``, comparisons, AND/OR/NOT, IS [NOT] NULL. Anything else is not
incrementally maintainable (the plan compiler raises :class:`NotMaintainable`). Division is left
out on purpose: PostgreSQL's integer and numeric division rules (truncation, result scale) are
not reproduced here.
"""

from __future__ import annotations

import datetime as dt
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, TypeAlias

from sketches.ivm import numeric
from sketches.ivm.errors import NotMaintainable
from sketches.ivm.zset import Row
from sketches.typeoids import FLOAT8, INT2, INT4, INT8

_CMP: dict[str, Callable[[Any, Any], Any]] = {
    "=": operator.eq, "<>": operator.ne, "!=": operator.ne,
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}
_ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "+": numeric.add, "-": numeric.subtract, "*": numeric.multiply,
}


@dataclass(frozen=True, slots=True)
class Col:
    index: int

    def eval(self, row: Row) -> object:
        return row[self.index]


@dataclass(frozen=True, slots=True)
class Const:
    value: object

    def eval(self, row: Row) -> object:
        return self.value


@dataclass(frozen=True, slots=True)
class Cmp:
    op: str
    left: Expr
    right: Expr

    def __post_init__(self) -> None:
        if self.op not in _CMP:
            raise ValueError(f"unsupported comparison {self.op!r}")

    def eval(self, row: Row) -> object:
        a, b = self.left.eval(row), self.right.eval(row)
        if a is None or b is None:
            return None
        if isinstance(a, str) or isinstance(b, str):
            if not (isinstance(a, str) and isinstance(b, str)):
                # found: max(v) <> '5000' was always true in Python (a NOT of it never)
                raise NotMaintainable("a quoted literal compared with a value of another type "
                                      "(PostgreSQL reads the literal as that type)")
            if self.op not in ("=", "<>", "!="):
                raise NotMaintainable("text ordering depends on the collation: not evaluated here")
            check_blanks(a, b)
        if isinstance(a, _TEMPORAL) or isinstance(b, _TEMPORAL):
            check_kinds(a, b)
        if type(a) is float or type(b) is float:
            a, b = as_float8(a), as_float8(b)
        elif is_nan(a) or is_nan(b):
            raise NotMaintainable("comparison with NaN is not evaluated here")
        return _CMP[self.op](a, b)


def is_nan(v: object) -> bool:
    """Whether ``v`` is a float or Decimal NaN. Such a value is never compared in Python:
    PostgreSQL's NaN equals NaN and is greater than every number, where Python's ``==`` is
    false and a Decimal NaN's ``<`` raises :class:`decimal.InvalidOperation` (which the
    manager takes for a bug of the engine, not for a value it cannot maintain)."""
    if type(v) is Decimal:
        return v.is_nan()
    return type(v) is float and v != v


def check_blanks(a: object, b: object) -> None:
    """Refuses text equality where a side ends in a blank: PostgreSQL's char(n) compares
    without trailing blanks (``'ab  ' = 'ab'`` is true for char(4)), and a Python string does
    not say whether it was char(n) or text."""
    if (isinstance(a, str) and a.endswith(" ")) or (isinstance(b, str) and b.endswith(" ")):
        raise NotMaintainable("text with trailing blanks (char(n) ignores them): not evaluated")


_TEMPORAL = (dt.date, dt.time)   # dt.datetime is a dt.date


def temporal_kind(v: object) -> str | None:
    """Which of PostgreSQL's date/time types a Python value stands for (None: not one):
    date, timestamp, timestamptz, time or timetz."""
    if isinstance(v, dt.datetime):
        return "timestamp" if v.tzinfo is None else "timestamptz"
    if isinstance(v, dt.date):
        return "date"
    if isinstance(v, dt.time):
        return "time" if v.tzinfo is None else "timetz"
    return None


def check_kinds(a: object, b: object) -> None:
    """Refuses comparing values of two kinds of :func:`temporal_kind` (or one with a
    non-date/time value): PostgreSQL casts one side (a date to the timestamp at its
    midnight, a timestamp to timestamptz in the session's zone, a time to timetz), where
    Python's ``==`` is false and ``<`` raises. (Found: ``d = $1`` with a date key and a
    timestamp parameter never held in Python: 0 rows instead of 1.)"""
    kind = temporal_kind(a)
    if kind != temporal_kind(b):
        raise NotMaintainable(f"a {kind or type(a).__name__} compared with a "
                              f"{temporal_kind(b) or type(b).__name__}: PostgreSQL casts one "
                              "side, not evaluated here")


def as_float8(v: Any) -> Any:
    """``v`` as PostgreSQL compares it with a float8: an integer or numeric is cast to float8
    (correctly rounded, as PostgreSQL's cast) — Python would compare the exact values, so
    ``avg = 0.33333333333333333333`` would not be ``<= 1/3::float8`` as it is in PostgreSQL.
    NaN is refused: PostgreSQL orders it above every number, Python compares it false."""
    if type(v) is int or type(v) is Decimal:
        v = to_float8(v)
    elif type(v) is not float:
        return v
    if v != v:
        raise NotMaintainable("comparison with NaN is not evaluated here")
    return v


def to_float8(v: int | Decimal) -> float:
    """PostgreSQL's cast of an integer or numeric to float8. A finite value beyond float8's
    range is an error there (``value out of range: overflow``), where Python's ``float``
    gives an infinity: refused (the sketch recaptures, PostgreSQL's error reaches the
    client)."""
    try:
        f = float(v)
    except OverflowError:
        f = math.inf
    if math.isinf(f) and not (type(v) is Decimal and v.is_infinite()):
        raise NotMaintainable(f"{v} is out of float8's range: an error in PostgreSQL")
    return f


_NUMBERS = (int, float, Decimal)


INT_BOUNDS = {INT2: 1 << 15, INT4: 1 << 31, INT8: 1 << 63}
"""Integer result types (smallint, integer, bigint) and the magnitude their values stay below."""


@dataclass(frozen=True, slots=True)
class Arith:
    """``left op right``. ``sql``: its text in the query; ``result_type``: the type oid
    PostgreSQL gives it (0: not known). A result PostgreSQL cannot hold in that type — an
    integer out of range, a float8 overflow or underflow — is an error there (the query
    fails), where Python would go on with a value: it raises :class:`NotMaintainable`, so the
    sketch recaptures and PostgreSQL's error reaches the client."""

    op: str
    left: Expr
    right: Expr
    sql: str = field(default="", compare=False, repr=False)
    result_type: int = 0

    def __post_init__(self) -> None:
        if self.op not in _ARITH:
            raise ValueError(f"unsupported arithmetic operator {self.op!r}")

    def eval(self, row: Row) -> object:
        a, b = self.left.eval(row), self.right.eval(row)
        if a is None or b is None:
            return None
        if isinstance(a, str) or isinstance(b, str):
            raise NotMaintainable("arithmetic on a quoted literal (PostgreSQL reads it as "
                                  "the other side's type)")
        if not isinstance(a, _NUMBERS) or not isinstance(b, _NUMBERS):
            # date − date is an integer there, a timedelta here
            raise NotMaintainable(f"{self.sql}: arithmetic on {type(a).__name__} and "
                                  f"{type(b).__name__} is not evaluated in Python")
        # PostgreSQL resolves float8 (op) numeric as float8 (op) float8
        if isinstance(a, float) and isinstance(b, Decimal):
            b = to_float8(b)
        elif isinstance(b, float) and isinstance(a, Decimal):
            a = to_float8(a)
        try:
            out = _ARITH[self.op](a, b)
        except InvalidOperation as exc:   # Infinity × 0, Infinity − Infinity: NaN there
            raise NotMaintainable(f"{self.sql}: a numeric NaN in PostgreSQL") from exc
        if self.result_type:
            self._check_range(a, b, out)
        return out

    def _check_range(self, a: Any, b: Any, out: Any) -> None:
        bound = INT_BOUNDS.get(self.result_type)
        if bound is not None and not -bound <= out < bound:
            raise NotMaintainable(f"{self.sql}: integer out of range in PostgreSQL")
        if self.result_type == FLOAT8 and type(out) is float and (
                (math.isinf(out) and not math.isinf(a) and not math.isinf(b))
                or (out == 0.0 and self.op == "*" and a != 0 and b != 0)):
            raise NotMaintainable(f"{self.sql}: float8 out of range in PostgreSQL")


@dataclass(frozen=True, slots=True)
class And:
    """AND with SQL's three-valued logic. It stops at the first false argument, unless an
    argument computes arithmetic (:func:`can_raise`): then every argument is evaluated, and
    an error of any one raises. Why: PostgreSQL does not evaluate in the written order — it
    runs a condition list cheapest first, moves a HAVING condition without aggregates into
    WHERE (every row of every group) and rewrites boolean trees — so an overflow the written
    order would never reach can be its error. Raised here, it recaptures, and the capture
    (the query itself) decides (found by a helper's search: ``HAVING count(*) + 0 + 0 > 60
    AND max(b) + 1 > 0`` and ``HAVING count(*) > 60 AND g * 60000000 >= 0`` answered rows
    where PostgreSQL raised integer out of range)."""

    args: tuple[Expr, ...]
    every: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "every", any(can_raise(a) for a in self.args))

    def eval(self, row: Row) -> object:
        if self.every:
            return combine([a.eval(row) for a in self.args], False)
        unknown = False
        for arg in self.args:
            v = arg.eval(row)
            if v is False:
                return False
            if v is None:
                unknown = True
        return None if unknown else True


@dataclass(frozen=True, slots=True)
class Or:
    """OR with SQL's three-valued logic: stops at the first true argument, or evaluates
    every one, as :class:`And` does."""

    args: tuple[Expr, ...]
    every: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "every", any(can_raise(a) for a in self.args))

    def eval(self, row: Row) -> object:
        if self.every:
            return combine([a.eval(row) for a in self.args], True)
        unknown = False
        for arg in self.args:
            v = arg.eval(row)
            if v is True:
                return True
            if v is None:
                unknown = True
        return None if unknown else False


def combine(values: list[object], is_or: bool) -> object:
    """OR (``is_or``) / AND of evaluated arguments, three-valued."""
    if any(v is is_or for v in values):
        return is_or
    return None if any(v is None for v in values) else not is_or


@dataclass(frozen=True, slots=True)
class Not:
    arg: Expr

    def eval(self, row: Row) -> object:
        v = self.arg.eval(row)
        return None if v is None else not v


@dataclass(frozen=True, slots=True)
class IsNull:
    arg: Expr
    negated: bool = False

    def eval(self, row: Row) -> object:
        return (self.arg.eval(row) is None) != self.negated


Expr: TypeAlias = Col | Const | Cmp | Arith | And | Or | Not | IsNull


def can_raise(expr: Expr) -> bool:
    """Does ``expr`` compute arithmetic (:class:`Arith`: an integer or float8 out of range
    raises, as PostgreSQL's would)?"""
    if isinstance(expr, Arith):
        return True
    if isinstance(expr, Col | Const):
        return False
    if isinstance(expr, Cmp):
        return can_raise(expr.left) or can_raise(expr.right)
    if isinstance(expr, And | Or):
        return expr.every
    return can_raise(expr.arg)


def columns(expr: Expr) -> frozenset[int]:
    """The row positions ``expr`` reads."""
    if isinstance(expr, Col):
        return frozenset((expr.index,))
    if isinstance(expr, Const):
        return frozenset()
    if isinstance(expr, Cmp | Arith):
        return columns(expr.left) | columns(expr.right)
    if isinstance(expr, And | Or):
        return frozenset().union(*(columns(a) for a in expr.args))
    return columns(expr.arg)


def comparisons(expr: Expr | None) -> list[Cmp]:
    """The comparisons of ``expr``, outermost first."""
    if isinstance(expr, Cmp):
        return [expr]
    if isinstance(expr, And | Or):
        return [c for arg in expr.args for c in comparisons(arg)]
    if isinstance(expr, Not | IsNull):
        return comparisons(expr.arg)
    return []


def holds(expr: Expr, row: Row) -> bool:
    """WHERE/HAVING semantics: only TRUE keeps the row (NULL and FALSE drop it)."""
    return expr.eval(row) is True
