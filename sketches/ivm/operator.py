"""Base classes of the incremental annotated operators (DESIGN §7, IMP §5).

An operator holds all of its state in explicit fields, consumes an annotated delta (a
:class:`~sketches.ivm.zset.ZSet`) with :meth:`step` and returns the delta of its output. The
contract, checked against the naive twins in :mod:`sketches.ivm.reference`: for any sequence of
input deltas ``d1 … dn`` whose running sums are bags, ``Σ step(di) == naive(Σ di)``.

``snapshot()`` returns a JSON-able dict of the state; ``restore(state)`` loads one into an
operator constructed with the same parameters (the plan is recompiled from the query, the state
is data).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from sketches.ivm.codec import Json
from sketches.ivm.errors import StateFormatError
from sketches.ivm.zset import ZSet


class Operator(ABC):
    """A unary incremental operator: ``step(delta) -> delta``."""

    kind: ClassVar[str] = "operator"

    @abstractmethod
    def step(self, delta: ZSet) -> ZSet:
        """Consumes one batch of input changes, returns the batch of output changes."""

    def snapshot(self) -> dict[str, Json]:
        """The operator's state as JSON-able data (stateless operators: ``{}``)."""
        return {"kind": self.kind}

    def restore(self, state: dict[str, Json]) -> None:
        """Replaces the operator's state by a :meth:`snapshot` of an equally built operator."""
        check_kind(self.kind, state)


def check_kind(kind: str, state: dict[str, Any]) -> None:
    if state.get("kind") != kind:
        raise StateFormatError(f"state of {state.get('kind')!r} cannot restore a {kind!r}")
