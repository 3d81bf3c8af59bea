"""The cyclic collector is off while any report runs, in any thread, and back as it was after."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from service.usecases.gc_pause import gc_paused


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    gc.enable()
    yield
    gc.enable()


def test_off_inside_and_on_after() -> None:
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_on_again_after_an_error() -> None:
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("a report failed")
    assert gc.isenabled()


def test_left_off_when_it_was_off() -> None:
    gc.disable()
    with gc_paused():
        pass
    assert not gc.isenabled()


def test_on_only_when_the_last_of_overlapping_reports_ends() -> None:
    first_in, second_done = threading.Event(), threading.Event()
    seen: list[bool] = []

    def first() -> None:
        with gc_paused():
            first_in.set()
            second_done.wait(5)
            seen.append(gc.isenabled())  # the other report ended: still off for this one
        seen.append(gc.isenabled())

    t = threading.Thread(target=first)
    t.start()
    assert first_in.wait(5)
    with gc_paused():
        pass
    second_done.set()
    t.join(5)
    assert seen == [False, True]
