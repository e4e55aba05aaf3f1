"""Python's cyclic garbage collector paused around work that allocates millions of objects.

Why: a state build, reload or save of a large state creates (or walks) a few container
objects per group, and every full collection meanwhile walks all of them while holding the
GIL: measured on 1M groups, the proxy's relay stalled up to 5 s at a time during a save and
12 s during a reload, and the reload took twice as long. The objects it makes are not
cyclic garbage (reference counting frees them), so nothing is lost by not collecting them.
A state's snapshot for a save is made, written and freed inside one pause: made in a pause
of its own and kept past it, its millions of objects were walked by the first collection
after it, the longest stall left of a save (0.6 s of 1M groups, ``bench/results/large-state-s34``).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = [0, False]   # pauses in force, whether the collector was enabled before the first


@contextmanager
def paused() -> Iterator[None]:
    """The collector off inside; reentrant and shared by threads (it is process-wide): it is
    enabled again, if it was before, when the last pause ends."""
    with _lock:
        if _depth[0] == 0:
            _depth[1] = gc.isenabled()
            gc.disable()
        _depth[0] += 1
    try:
        yield
    finally:
        with _lock:
            _depth[0] -= 1
            if _depth[0] == 0 and _depth[1]:
                gc.enable()
