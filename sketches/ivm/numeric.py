"""PostgreSQL's numeric ``+ − ×`` on Python Decimals: exact.

Why: Python's default decimal context rounds every result to 28 significant digits, where
PostgreSQL's numeric keeps them all. A running sum of wide numeric values would drift from
PostgreSQL's, and a sum beside a HAVING threshold could decide its group wrongly (a missing
fragment: a wrong answer). Division is not here: avg's is ``accumulators.pg_numeric_div``.

NaN and ±Infinity are not added at all (:func:`scale`, :func:`finite_difference`): PostgreSQL's
sum counts them apart from the finite sum (a group's sum is NaN/±Infinity only while such a
value is in it), while a running Decimal or float sum keeps a NaN after the row is deleted
(NaN − NaN is NaN; Infinity − Infinity is NaN or an error). A non-finite value entering or
leaving a sum is refused (:class:`NotMaintainable`: the caller recaptures).
"""

from __future__ import annotations

from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal
from typing import Any

from sketches.ivm.errors import NotMaintainable

EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)
"""A context whose ``+ − ×`` never round (the default context's traps)."""

MAX_WHOLE_DIGITS = 131_072
"""Digits before the point PostgreSQL's numeric holds (``NUMERIC_WEIGHT_MAX``): a result
with more raises 22003 there (``value overflows numeric format``), also a sum or average
whose rows each fit."""
MAX_SCALE = 16_383
"""Digits after the point PostgreSQL's numeric holds (``NUMERIC_DSCALE_MAX``): it rounds a
product with more, which this module does not."""


def add(a: Any, b: Any) -> Any:
    """``a + b``, exact when either is a Decimal (:func:`checked`)."""
    if type(a) is Decimal or type(b) is Decimal:
        return checked(EXACT.add(a, b))
    return a + b


def subtract(a: Any, b: Any) -> Any:
    """``a − b``, exact when either is a Decimal (:func:`checked`)."""
    if type(a) is Decimal or type(b) is Decimal:
        return checked(EXACT.subtract(a, b))
    return a - b


def multiply(a: Any, b: Any) -> Any:
    """``a × b``, exact when either is a Decimal (:func:`checked`; a product of two with more
    than :data:`MAX_SCALE` digits after the point is refused too)."""
    if type(a) is Decimal or type(b) is Decimal:
        out = checked(EXACT.multiply(a, b))
        exponent = out.as_tuple().exponent if type(a) is type(b) else 0
        if type(exponent) is int and -exponent > MAX_SCALE:
            raise NotMaintainable(f"a numeric product rounded to {MAX_SCALE} digits after "
                                  "the point in PostgreSQL")
        return out
    return a * b


def checked(value: Decimal) -> Decimal:
    """``value``, unless PostgreSQL's numeric cannot hold it (:data:`MAX_WHOLE_DIGITS`): then
    :class:`NotMaintainable` (the caller recaptures, and PostgreSQL raises its own error
    or, when a later row made it fit again, answers). Found by a helper's search: a maintained
    sum of two values of 131,072 digits answered rows where PostgreSQL raises 22003."""
    if value.is_finite() and value.adjusted() >= MAX_WHOLE_DIGITS:
        raise NotMaintainable("a numeric beyond PostgreSQL's 131,072 digits before the point")
    return value


def is_finite(value: object) -> bool:
    """False for a Decimal or float NaN or ±Infinity (anything else counts as finite)."""
    if type(value) is Decimal:
        return value.is_finite()
    if type(value) is float:
        return value - value == 0.0   # inf - inf and nan - nan are nan
    return True


def refuse_non_finite(value: object) -> None:
    """Raises :class:`NotMaintainable` for a NaN or ±Infinity entering or leaving a sum (see
    the module docstring)."""
    if not is_finite(value):
        raise NotMaintainable(f"a sum over {value!r} is not maintained")


def scale(value: Decimal) -> int:
    """PostgreSQL's display scale of a numeric: its digits after the point, trailing zeros
    included (psycopg keeps them: ``1.50`` is ``Decimal('1.50')``). Raises
    :class:`NotMaintainable` for NaN and ±Infinity (see the module docstring)."""
    exp = value.as_tuple().exponent
    if type(exp) is not int:
        raise NotMaintainable(f"a sum over {value!r} is not maintained")
    return -exp if exp < 0 else 0


def finite_difference(plus: Any, minus: Any) -> Any:
    """``plus − minus`` for the sums of the inserted and the deleted values of a pre-aggregated
    delta; raises :class:`NotMaintainable` when either is NaN or ±Infinity."""
    refuse_non_finite(plus)
    refuse_non_finite(minus)
    return subtract(plus, minus)
