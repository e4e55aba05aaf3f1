"""Reading the SQL text of analysed expressions without pglast (only ``sketches.sql`` imports
it): binding ``$n`` parameters as literals, and parsing HAVING / ORDER BY expressions over
aggregate results into :mod:`sketches.ivm.expr` trees.

The texts come from ``QueryAnalysis`` (printed by pglast, so normalised). The parser accepts
only: the texts of the query's aggregate calls and GROUP BY expressions (matched verbatim, as
the analyser printed them, and only where PostgreSQL's operator precedence makes them a whole
operand), numeric and string constants, ``$n``, NULL/TRUE/FALSE, ``+ - *``, comparisons,
AND/OR/NOT, IS [NOT] NULL, parentheses and casts of constants to numeric types. Anything else
raises :class:`NotMaintainable`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql

from sketches.ivm.errors import NotMaintainable
from sketches.ivm.expr import And, Arith, Cmp, Const, Expr, IsNull, Not, Or

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<string>[Ee]?'(?:[^']|'')*')
  | (?P<qident>"(?:[^"]|"")*")
  | (?P<dollar>\$(?P<tag>[A-Za-z_][A-Za-z_0-9]*)?\$)
  | (?P<param>\$[0-9]+)
  | (?P<number>(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)
  | (?P<word>[A-Za-z_][A-Za-z_0-9$]*)
  | (?P<op>::|<=|>=|<>|!=|\|\||[-+*/%<>=(),.\[\];:^~!@#&|`?])
""", re.VERBOSE)


def _to_int(v: object) -> int:
    """An integer cast of a constant whose text is an integer; others (PostgreSQL rounds
    ``7.5::int`` to 8, Python's ``int('7.5')`` fails) are refused."""
    text = str(v)
    if not re.fullmatch(r"[+-]?[0-9]+", text.strip()):
        raise NotMaintainable(f"cast of {text!r} to an integer is not evaluated in Python")
    return int(text)


_CASTS: dict[str, Callable[[object], object]] = {
    "numeric": lambda v: Decimal(str(v)), "decimal": lambda v: Decimal(str(v)),
    **dict.fromkeys(("int", "integer", "int4", "int8", "bigint", "smallint", "int2"), _to_int),
}


Token = tuple[str, str, int]
"""``(kind, text, offset)`` of :func:`tokens`."""

_INFIX: dict[str, int] = {
    "OR": 1, "AND": 2, "IS": 4, "ISNULL": 4, "NOTNULL": 4,
    "=": 5, "<>": 5, "!=": 5, "<": 5, "<=": 5, ">": 5, ">=": 5,
    "NOT": 6, "BETWEEN": 6, "IN": 6, "LIKE": 6, "ILIKE": 6, "SIMILAR": 6, "ESCAPE": 6,
    "OPERATOR": 7, "OVERLAPS": 7, "+": 8, "-": 8, "*": 9, "/": 9, "%": 9, "^": 10,
    "AT": 11, "COLLATE": 12, "[": 14, "::": 15,
}
"""How tightly PostgreSQL's binary and postfix operators bind (its documented precedence,
higher first: ``:: [ ] unary± COLLATE AT ^ */% +- (other operators) BETWEEN/IN/LIKE/NOT LIKE
comparisons IS NOT AND OR``); an operator symbol not listed binds as "other" (7)."""
_PREFIX: dict[str, int] = {"NOT": 3, "+": 13, "-": 13}
_OTHER, _ATOM = 7, 16
_PUNCT = frozenset({"(", ")", "]", ",", ".", ";", ":"})
"""Operator-kind tokens that are no operators."""


def tokens(text: str) -> list[Token]:
    """``(kind, text, offset)`` tokens; whitespace dropped; dollar-quoted strings rejected."""
    out: list[Token] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise NotMaintainable(f"cannot tokenize SQL at {text[pos:pos + 20]!r}")
        kind = m.lastgroup or ""
        if kind == "tag":
            kind = "dollar"
        if kind == "dollar":
            raise NotMaintainable("dollar-quoted strings are not supported")
        if kind != "ws":
            out.append((kind, m.group(), pos))
        pos = m.end()
    return out


def param_literal(value: object, conn: psycopg.Connection[Any] | None = None) -> str:
    """``value`` as a SQL literal of the type psycopg binds it as, so SQL with it inlined
    means what the statement bound with it means: a float is a float8. (psycopg's literal of
    ``100.0`` is a numeric, whose text is ``100.0`` where the float8's is ``100``, and a
    numeric has no ``-0``: found, ``s = $1::text`` with ``-0.0`` built a state that matched
    no row.) A Decimal is a numeric (psycopg's literal of ``Decimal(2)`` is ``2``, an
    integer: found, ``v / $1`` divided integers in the delta reads, and a numeric query
    shared the state of an int one.) An int is the narrowest of smallint, integer, bigint and
    numeric that holds it, as psycopg binds it (a bare ``2`` is an integer: found, ``max(s) *
    $1`` over a smallint with 2 bound was typed integer in the engine and in the delta reads,
    and a smallint overflow PostgreSQL raises for the query was a number there: rows instead
    of the error)."""
    if type(value) is float:
        return f"'{value!r}'::float8"
    if type(value) is Decimal:
        return f"'{value}'::numeric"
    if type(value) is int:
        return f"'{value}'::{_int_type(value)}"
    return sql.Literal(value).as_string(conn)


def _int_type(value: int) -> str:
    """The type psycopg binds ``value`` as (``psycopg.types.numeric.IntDumper.upgrade``)."""
    for bits, name in ((16, "int2"), (32, "int4"), (64, "int8")):
        if -(1 << (bits - 1)) <= value < 1 << (bits - 1):
            return name
    return "numeric"


def bind_params(text: str, params: Sequence[object] | None,
                literal: Callable[[object], str]) -> str:
    """``text`` with every ``$n`` (outside quotes) replaced by ``literal(params[n-1])``."""
    parts: list[str] = []
    last = 0
    for kind, tok, pos in tokens(text):
        if kind != "param":
            continue
        n = int(tok[1:])
        if params is None or n > len(params):
            raise NotMaintainable(f"parameter {tok} has no value")
        parts.append(text[last:pos])
        parts.append(literal(params[n - 1]))
        last = pos + len(tok)
    parts.append(text[last:])
    return "".join(parts)


def _precedence(toks: Sequence[Token], k: int) -> int | None:
    """How tightly ``toks[k]`` binds as an operator (prefix where an operand starts, else
    binary or postfix); None when it is no operator (an operand, a bracket, a comma)."""
    kind, text, _pos = toks[k]
    if kind == "word":
        text = text.upper()
    elif kind != "op":
        return None
    if text in _PREFIX and _operand_starts(toks, k):
        return _PREFIX[text]
    if text in _INFIX:
        return _INFIX[text]
    return _OTHER if kind == "op" and text not in _PUNCT else None


def _operand_starts(toks: Sequence[Token], k: int) -> bool:
    """Does an operand start at ``toks[k]``: first, or after an opening bracket, a comma or
    an operator?"""
    return k == 0 or toks[k - 1][1] in ("(", "[", ",") or _precedence(toks, k - 1) is not None


def _binding(toks: Sequence[Token]) -> int:
    """How tightly the expression ``toks`` holds together: the precedence of its loosest
    operator outside brackets (:data:`_ATOM` when it has none: a column, a call)."""
    low, depth = _ATOM, 0
    for k, (_kind, text, _pos) in enumerate(toks):
        if depth == 0:
            p = _precedence(toks, k)
            if p is not None:
                low = min(low, p)
        if text in ("(", "["):
            depth += 1
        elif text in (")", "]"):
            depth -= 1
    return low


class _Parser:
    def __init__(self, text: str, leaves: Sequence[tuple[str, Expr]],
                 params: Sequence[object] | None, types: Mapping[str, int]) -> None:
        self.text = text
        self.toks = tokens(text)
        self.i = 0
        self.params = params
        self.types = types
        # leaves as token sequences with their binding, longest first
        self.leaves: list[tuple[tuple[str, ...], int, Expr]] = []
        for s, e in leaves:
            toks = tokens(s)
            self.leaves.append((tuple(t[1] for t in toks), _binding(toks), e))
        self.leaves.sort(key=lambda le: -len(le[0]))

    def peek(self, k: int = 0) -> str | None:
        j = self.i + k
        return self.toks[j][1] if j < len(self.toks) else None

    def peek_upper(self) -> str:
        tok = self.peek()
        return tok.upper() if tok is not None else ""

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok.upper() != expected):
            raise NotMaintainable(f"expected {expected or 'a token'} in {self.text!r}")
        self.i += 1
        return tok

    def parse(self) -> Expr:
        e = self.or_()
        if self.peek() is not None:
            raise NotMaintainable(f"unsupported SQL near {self.peek()!r} in {self.text!r}")
        return e

    def or_(self) -> Expr:
        args = [self.and_()]
        while self.peek_upper() == "OR":
            self.take()
            args.append(self.and_())
        return args[0] if len(args) == 1 else Or(tuple(args))

    def and_(self) -> Expr:
        args = [self.not_()]
        while self.peek_upper() == "AND":
            self.take()
            args.append(self.not_())
        return args[0] if len(args) == 1 else And(tuple(args))

    def not_(self) -> Expr:
        if self.peek_upper() == "NOT":
            self.take()
            return Not(self.not_())
        return self.comparison()

    def comparison(self) -> Expr:
        left = self.additive()
        op = self.peek()
        if op in ("=", "<>", "!=", "<", "<=", ">", ">="):
            self.take()
            return Cmp(op, left, self.additive())
        if self.peek_upper() == "IS":
            self.take()
            negated = False
            if self.peek_upper() == "NOT":
                self.take()
                negated = True
            self.take("NULL")
            return IsNull(left, negated)
        return left

    def additive(self) -> Expr:
        start = self.i
        e = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            e = self.arith(op, e, self.term(), start)
        return e

    def term(self) -> Expr:
        start = self.i
        e = self.unary()
        while self.peek() == "*":
            op = self.take()
            e = self.arith(op, e, self.unary(), start)
        if self.peek() in ("/", "%"):
            raise NotMaintainable("division is not evaluated in Python")
        return e

    def arith(self, op: str, left: Expr, right: Expr, start: int) -> Arith:
        """``Arith`` over the tokens from ``start`` to the last one taken (its text typed by
        ``self.types``)."""
        _kind, last, end = self.toks[self.i - 1]
        text = self.text[self.toks[start][2]:end + len(last)]
        return Arith(op, left, right, text, self.types.get(text, 0))

    def unary(self) -> Expr:
        if self.peek() == "-":
            start = self.i
            self.take()
            e = self.unary()
            if isinstance(e, Const):
                return _negated(e)
            return self.arith("-", Const(0), e, start)
        e = self.primary()
        while self.peek() == "::":
            self.take()
            typ = self.take().lower()
            if not isinstance(e, Const) or typ not in _CASTS:
                raise NotMaintainable(f"cast to {typ} is not evaluated in Python")
            e = Const(None if e.value is None else _CASTS[typ](e.value))
        return e

    def whole_operand(self, n: int, binding: int) -> bool:
        """Are the ``n`` tokens from here, an expression of ``binding``
        (:func:`_binding`), a whole operand of this text as PostgreSQL parses it? Their
        neighbours must bind more loosely: to the left an operator binding less (an equal one
        takes the left operand first), to the right one binding no more (left-associative).
        Found: leaf ``a + 1`` matched in ``a + 1 * -1``, which became ``(a + 1) * -1``: 0
        rows instead of 99."""
        before, after = self.i - 1, self.i + n
        if before >= 0 and self.toks[before][1] not in ("(", "[", ","):
            p = _precedence(self.toks, before)
            if p is None or p >= binding:
                return False
        if after < len(self.toks) and self.toks[after][1] not in (")", "]", ","):
            p = _precedence(self.toks, after)
            if p is None or p > binding:
                return False
        return True

    def primary(self) -> Expr:
        for seq, binding, leaf in self.leaves:
            if (tuple(self.peek(k) for k in range(len(seq))) == seq
                    and self.whole_operand(len(seq), binding)):
                self.i += len(seq)
                return leaf
        kind = self.toks[self.i][0] if self.i < len(self.toks) else ""
        tok = self.take()
        if tok == "(":
            e = self.or_()
            self.take(")")
            return e
        if kind == "number":
            return Const(Decimal(tok) if any(c in tok for c in ".eE") else int(tok))
        if kind == "string" and not tok.startswith(("E", "e")):
            return Const(tok[1:-1].replace("''", "'"))
        if kind == "param":
            n = int(tok[1:])
            if self.params is None or n > len(self.params):
                raise NotMaintainable(f"parameter {tok} has no value")
            return Const(self.params[n - 1])
        if tok.upper() in ("NULL", "TRUE", "FALSE"):
            return Const({"NULL": None, "TRUE": True, "FALSE": False}[tok.upper()])
        raise NotMaintainable(f"cannot evaluate {tok!r} of {self.text!r} in Python")


def _negated(e: Expr) -> Expr:
    """``-e``; a negative number as a constant, as PostgreSQL reads one (exactly:
    ``copy_negate`` does not round to the decimal context), so that comparisons with it keep
    the fast paths for constants (:mod:`sketches.ivm.ops.select`, ``grouptest``)."""
    if isinstance(e, Const):
        if type(e.value) is int:
            return Const(-e.value)
        if isinstance(e.value, Decimal):
            return Const(e.value.copy_negate())
    return Arith("-", Const(0), e)


def parse_expression(text: str, leaves: Sequence[tuple[str, Expr]],
                     params: Sequence[object] | None = None,
                     types: Mapping[str, int] | None = None) -> Expr:
    """Parses ``text`` into an :data:`Expr`; ``leaves`` maps SQL texts (aggregate calls, GROUP
    BY expressions) to the expressions standing for them (usually output columns); ``types``:
    the type oids PostgreSQL gives the texts of the arithmetic (:attr:`Arith.sql`)."""
    return _Parser(text, leaves, params, types or {}).parse()


def arithmetic(expr: Expr | None) -> list[Arith]:
    """The arithmetic nodes of ``expr``, outermost first."""
    if isinstance(expr, Arith):
        return [expr, *arithmetic(expr.left), *arithmetic(expr.right)]
    if isinstance(expr, Cmp):
        return [*arithmetic(expr.left), *arithmetic(expr.right)]
    if isinstance(expr, And | Or):
        return [a for arg in expr.args for a in arithmetic(arg)]
    if isinstance(expr, Not | IsNull):
        return arithmetic(expr.arg)
    return []
