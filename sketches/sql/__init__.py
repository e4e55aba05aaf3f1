"""SQL analysis and rewriting for provenance sketches — the only package importing pglast.

* ``parse``: parse one SELECT, print it back, fingerprint, the re-parse safety belt, scopes;
* ``model``: the ``QueryAnalysis`` dataclasses;
* ``analysis``: ``analyse(sql, resolver=None) -> QueryAnalysis`` (or ``UnsupportedQuery``);
* ``rewrite``: the skipping predicate and the capture query, built as pglast ASTs;
* ``template``: template instances and the "captured sketch is reusable" test.
"""

from sketches.sql.analysis import ColumnResolver, analyse
from sketches.sql.model import (
    AggregateCall,
    ColumnRef,
    Expression,
    Limit,
    OrderItem,
    QueryAnalysis,
    Scope,
    SelectItem,
    TableRef,
)
from sketches.sql.parse import fingerprint

__all__ = [
    "AggregateCall", "ColumnRef", "ColumnResolver", "Expression", "Limit", "OrderItem",
    "QueryAnalysis", "Scope", "SelectItem", "TableRef", "analyse", "fingerprint",
]
