"""Oids of PostgreSQL's built-in types (fixed in ``pg_type.dat``), named once for every module
that decides by a column's, parameter's or expression's type."""

from __future__ import annotations

BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 19, 20, 21, 23, 25, 26
FLOAT4, FLOAT8, UNKNOWN, BPCHAR, VARCHAR = 700, 701, 705, 1042, 1043
DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, TIMETZ = 1082, 1083, 1114, 1184, 1186, 1266
NUMERIC, UUID = 1700, 2950

INTEGERS = frozenset({INT2, INT4, INT8})
FLOATS = frozenset({FLOAT4, FLOAT8})
TEXT_LIKE = frozenset({TEXT, VARCHAR})
"""text and varchar: varchar has text's operators, so the two compare and cast as one."""
