"""PostgreSQL's numeric ``+ − ×`` on Python Decimals: exact.

Why: Python's default decimal context rounds every result to 28 significant digits, where
PostgreSQL's numeric keeps them all. A running sum of wide numeric values would drift from
PostgreSQL's, and a sum beside a HAVING threshold could decide its group wrongly (a missing
fragment: a wrong answer). Division is not here: avg's is ``accumulators.pg_numeric_div``.
"""

from __future__ import annotations

from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal
from typing import Any

EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)
"""A context whose ``+ − ×`` never round (the default context's traps)."""


def add(a: Any, b: Any) -> Any:
    """``a + b``, exact when either is a Decimal."""
    if type(a) is Decimal or type(b) is Decimal:
        return EXACT.add(a, b)
    return a + b


def subtract(a: Any, b: Any) -> Any:
    """``a − b``, exact when either is a Decimal."""
    if type(a) is Decimal or type(b) is Decimal:
        return EXACT.subtract(a, b)
    return a - b


def multiply(a: Any, b: Any) -> Any:
    """``a × b``, exact when either is a Decimal."""
    if type(a) is Decimal or type(b) is Decimal:
        return EXACT.multiply(a, b)
    return a * b
