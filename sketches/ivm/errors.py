"""Exceptions of the incremental engine. Each names what the caller should do about it."""

from __future__ import annotations

from collections.abc import Sequence


class IvmError(Exception):
    """Base class of the incremental engine's errors."""


class NotMaintainable(IvmError):
    """The query (or part of it) cannot be maintained incrementally: recapture instead."""


class StateTooLarge(NotMaintainable):
    """A state build would read more rows than ``max_state_rows``: the template's sketches
    are kept by recapture, and no build of the template is tried again under that limit."""


class InconsistentDelta(IvmError):
    """A delta deletes more than the operator's state holds: the state does not match the
    database (wrong version, lost deltas). The operator's state is unusable: recapture."""


class BufferExhausted(IvmError):
    """A bounded min/max or top-k buffer ran dry while rows remain (IMP §7.2). Refill the named
    groups from PostgreSQL (configure a refill callback) or recapture; never guess.

    After this exception the raising operator's state is incomplete: the caller must recapture
    (or restore an earlier snapshot)."""

    def __init__(self, operator: str, groups: Sequence[tuple[object, ...]]) -> None:
        super().__init__(f"{operator}: bounded buffer exhausted for {len(groups)} group(s)")
        self.operator = operator
        self.groups = tuple(groups)


class Invalidated(IvmError):
    """TRUNCATE or DDL bumped a table's epoch since the state was built, the table is no
    longer tracked, or garbage collection deleted audit rows the state had not applied (its
    version does not contain the table's watermark, ``imp.collected``): recapture."""


class DeltaRaised(IvmError):
    """PostgreSQL raised a data exception (SQLSTATE class 22) evaluating the query's
    expressions on an audit row. The delta read evaluates them on rows the original query
    never reads in this snapshot — an UPDATE's old image, a row inserted and deleted since
    the state's version — so a WHERE such as ``10 / (a - 60) < 5`` may raise where
    PostgreSQL answers (found: the sketch was stuck, every later read raised again). The
    state is unharmed but cannot move past those rows: recapture, which reads the current
    rows only."""


class PipelineBroken(IvmError):
    """An earlier maintain() failed half-way; the in-memory state is unusable: rebuild it
    (build_state) or restore a persisted snapshot."""


class StateFormatError(IvmError):
    """A persisted operator state cannot be restored (unknown format or version)."""
