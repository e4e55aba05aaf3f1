"""A tiny *real* sketch hook for testing the proxy's wrapping before/independently of the
sketches library: it runs real SQL on the service connection it is given (in the client's
exported snapshot) and returns an instrumented query that is equivalent in that snapshot.

Recognised: any query on table ``probe`` (columns id, grp) that groups. The instrumented SQL
adds ``id <= K`` where K = max(id) read on the service connection, which is always true for
the rows the client's snapshot sees — and only then. ``IMP SHOW STATS`` reports K and the
decoded parameters, so tests can check that both sides used the very same snapshot.

Started by the proxy as ``--hook tests.imp_proxy.hooks:create_hook``.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

_PROBE = re.compile(r"\bfrom\s+probe\b", re.I)
_GROUP = re.compile(r"\bgroup\s+by\b", re.I)


@dataclass(frozen=True, slots=True)
class Classification:
    candidate: bool
    reason: str
    template: str | None


@dataclass(frozen=True, slots=True)
class Prepared:
    decision: str
    reason: str
    sketch_id: int | None
    instrumented_sql: str | None


class HookFailure(RuntimeError):
    """Raised on purpose for queries containing 'fail_me' (fallback tests)."""


class ProbeHook:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.prepares = 0
        self.classified = 0
        self.last_k: int | None = None
        self.last_params: list[object] | None = None
        self.last_search_path: str | None = None
        self.dropped: list[int] = []
        self.strategy = "lazy"

    def classify(self, sql: str) -> Classification:
        with self._lock:
            self.classified += 1
        if _PROBE.search(sql) and _GROUP.search(sql):
            return Classification(True, "probe query", "probe")
        return Classification(False, "not a probe query", None)

    def prepare(self, conn: psycopg.Connection[Any], sql: str,
                params: Sequence[object] | None = None,
                search_path: str | None = None) -> Prepared:
        if "fail_me" in sql:
            raise HookFailure("asked to fail")
        if "passthrough_me" in sql:
            return Prepared("passthrough", "asked to pass through", None, None)
        row = conn.execute("SELECT coalesce(max(id), 0) FROM probe").fetchone()
        assert row is not None
        k = int(row[0])
        with self._lock:
            self.prepares += 1
            self.last_k = k
            self.last_params = list(params) if params is not None else None
            self.last_search_path = search_path
        where = f"id <= {k}"
        if "extra_param_me" in sql and params:  # a rewrite that needs one more parameter
            where += f" AND ${len(params) + 1}::int IS NULL"
        if "unparsable_me" in sql:  # a rewrite PostgreSQL rejects at Parse
            where += " AND no_such_column > 0"
        if re.search(r"\bwhere\b", sql, re.I):
            instrumented = re.sub(r"\bwhere\b", f"WHERE {where} AND", sql, count=1, flags=re.I)
        else:
            instrumented = _GROUP.sub(f"WHERE {where} GROUP BY", sql, count=1)
        return Prepared("use", "probe sketch", 1, instrumented)

    def configure(self, name: str, value: str) -> None:
        """The optional library-settings seam behind ``IMP SET <name> = <value>``."""
        if name != "strategy":
            raise KeyError(name)
        if value not in ("lazy", "eager"):
            raise ValueError(f"strategy must be lazy or eager, not {value!r}")
        self.strategy = value

    def sketches(self) -> list[dict[str, object]]:
        if 1 in self.dropped:
            return []
        return [{"sketch_id": 1, "template": "probe", "tables": ["probe"],
                 "attributes": ["probe.id"], "fragments": 8, "selected_fragments": [0, 3],
                 "version": "1:2:", "strategy": "eager", "captures": 1, "maintenances": 0,
                 "uses": self.prepares, "last_used": None}]

    def stats(self) -> dict[str, object]:
        with self._lock:
            return {"hook.prepares": self.prepares, "hook.classified": self.classified,
                    "hook.last_k": self.last_k, "hook.last_params": repr(self.last_params),
                    "hook.last_search_path": self.last_search_path,
                    "hook.strategy": self.strategy}

    def drop(self, conn: psycopg.Connection[Any], sketch_id: int) -> bool:
        conn.execute("SELECT 1")  # the service connection works
        if sketch_id != 1 or 1 in self.dropped:
            return False
        self.dropped.append(1)
        return True

    def drop_all(self, conn: psycopg.Connection[Any]) -> int:
        conn.execute("SELECT 1")
        n = 0 if 1 in self.dropped else 1
        self.dropped.append(1)
        return n


def create_hook() -> ProbeHook:
    return ProbeHook()


def slow_sketch_manager(*args: Any, **kwargs: Any) -> Any:
    """The sketch library's own manager, whose prepare first sleeps :data:`PREPARE_DELAY`
    seconds: a window in which a test's other session can queue a lock behind the lock the
    wrapping took on the client's backend, before the service connection reads anything."""
    from sketches.manager import SketchManager

    class SlowSketchManager(SketchManager):
        def prepare(self, *a: Any, **k: Any) -> Any:
            time.sleep(PREPARE_DELAY)
            return super().prepare(*a, **k)

    return SlowSketchManager(*args, **kwargs)


slow_sketch_manager.PER_DATABASE = True  # type: ignore[attr-defined]
PREPARE_DELAY = 3.0
