"""A least-recently-used map bounded by its entries and by the characters of its texts.

Why characters too: the caches keyed by query text (the router's decisions, the manager's
classifications, analyses, instances and answers, the instrumented texts) were bounded by
entries only, so long texts cost memory without limit short of the entry count (found by a
resource search in session 26: 800 distinct queries with 256 KiB comments, +218 MiB).
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar, cast

K = TypeVar("K")
V = TypeVar("V")
R = TypeVar("R")

MAX_CHARS = 16 << 20
"""Characters (of keys and text values) one cache holds at most, unless given otherwise."""


def chars(item: object) -> int:
    """The characters of the texts in ``item`` (nested tuples summed; anything else 0)."""
    if isinstance(item, (str, bytes)):
        return len(item)
    if isinstance(item, tuple):
        return sum(chars(x) for x in item)
    return 0


class Lru(Generic[K, V]):
    """At most ``max_entries`` entries of at most ``max_chars`` (:data:`MAX_CHARS`)
    characters in all; the least recently used go first, and an entry larger than
    ``max_chars`` alone is not kept. Not thread-safe: a cache shared by threads is used under
    its owner's lock."""

    def __init__(self, max_entries: int, max_chars: int | None = None) -> None:
        self.max_entries = max_entries
        self.max_chars = MAX_CHARS if max_chars is None else max_chars
        self.chars = 0
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: K) -> V | None:
        """The value of ``key``, now the most recently used, or None."""
        hit = self._items.get(key)
        if hit is None:
            return None
        self._items.move_to_end(key)
        return hit[0]

    def put(self, key: K, value: V) -> None:
        self.pop(key)
        size = chars(key) + chars(value)
        if size > self.max_chars or self.max_entries <= 0:
            return
        self._items[key] = (value, size)
        self.chars += size
        while len(self._items) > self.max_entries or self.chars > self.max_chars:
            self.chars -= self._items.popitem(last=False)[1][1]

    def pop(self, key: K) -> V | None:
        old = self._items.pop(key, None)
        if old is None:
            return None
        self.chars -= old[1]
        return old[0]

    def clear(self) -> None:
        self._items.clear()
        self.chars = 0


def cached(max_entries: int, max_chars: int | None = None
           ) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Like :func:`functools.lru_cache` on hashable positional arguments, bounded by
    characters too (:class:`Lru`; thread-safe). For functions of query texts."""
    def wrap(fn: Callable[..., R]) -> Callable[..., R]:
        cache: Lru[tuple[object, ...], R] = Lru(max_entries, max_chars)
        lock = threading.Lock()

        @functools.wraps(fn)
        def call(*args: object) -> R:
            with lock:
                if args in cache:
                    return cast(R, cache.get(args))
            result = fn(*args)
            with lock:
                cache.put(args, result)
            return result
        return call
    return wrap
