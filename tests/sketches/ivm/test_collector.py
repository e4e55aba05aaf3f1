"""The cyclic garbage collector's pause around large state work (sketches.ivm.collector)."""

from __future__ import annotations

import gc
import threading

from sketches.ivm import collector


def test_a_pause_is_reentrant_and_restores_the_collector() -> None:
    assert gc.isenabled()
    with collector.paused():
        assert not gc.isenabled()
        with collector.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()   # the outer pause still holds
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled() -> None:
    gc.disable()
    try:
        with collector.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_pauses_of_two_threads_end_when_the_last_one_ends() -> None:
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with collector.paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(10)
    with collector.paused():
        pass
    assert not gc.isenabled()   # the other thread's pause is still in force
    release.set()
    t.join(10)
    assert gc.isenabled()


def test_an_exception_inside_ends_the_pause() -> None:
    try:
        with collector.paused():
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert gc.isenabled()
