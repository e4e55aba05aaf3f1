"""Exception classes of the sketch library.

Every failure the proxy must react to (by forwarding the client's original SQL) is a
``SketchError``; the subclasses say which stage refused.
"""

from __future__ import annotations


class SketchError(Exception):
    """Base class: the query cannot be answered with a sketch; forward it unchanged."""


class UnsupportedQuery(SketchError):
    """The query is outside the class the analyser understands.

    ``str(exc)`` is ``"unsupported: <reason>"``; ``exc.reason`` is the bare reason.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"unsupported: {reason}")
        self.reason = reason


class NeedsCatalog(UnsupportedQuery):
    """Analysis needs the database catalog (e.g. to resolve an unqualified column in a join)
    and was run without a column resolver. Not a verdict on the query: retry with one."""


class NotSketchable(SketchError):
    """The query is supported but no attribute is provably safe (DESIGN §4)."""


class SelfWritten(SketchError):
    """The manager's own DDL in the capture's transaction fired a user's event trigger,
    which may have changed the query's tables: a capture in it would see rows the client's
    snapshot does not hold."""


class PartitionError(SketchError):
    """A range partition could not be built (unknown table/column, unsupported type)."""


class CaptureError(SketchError):
    """The capture query failed or returned something unexpected."""


class InstrumentationError(SketchError):
    """The rewritten query did not survive the print/re-parse safety belt."""


class TemplateBusy(SketchError):
    """Another thread's work on the query's template (a capture, a maintenance) held it
    longer than ``SketchSettings.template_wait``; nothing was decided."""


class Interrupted(SketchError):
    """The caller stopped a prepare that was waiting (for another prepare of the same
    template); nothing was decided."""


class CatalogBusy(SketchError):
    """Another thread's transaction is installing schema ``imp`` and has not committed: the
    query passes through rather than reading a catalog it cannot see yet."""
