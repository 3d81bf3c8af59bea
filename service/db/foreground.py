"""Reads first: a background round pauses at its statements and in its long loops while an API
read runs in this process, so a page does not share the interpreter lock with a rollup.

One process runs its API reads and its background rounds (rollups, useful work, today's sums)
on threads of one interpreter; a round's pure-Python loops hold the lock for hundreds of ms,
and a page read waiting for it took 3 s at worst on a 2-core machine mostly idle (3,000 GPUs,
docs/benchmarks.md). A round gives way only while reads are in flight, for at most
``MAX_PAUSE_SECONDS`` at a time and never longer in all than it has run (so it takes at most
twice its time), and only at points between its statements or rows, never inside a database
call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import Engine, event

# The longest a round waits for reads at one point (a read that takes longer shares the lock).
MAX_PAUSE_SECONDS = 1.0
# Rows a round's loop handles between two looks at whether reads are in flight.
ROWS_PER_LOOK = 512

_lock = threading.Lock()
_reads = 0  # API reads in flight in this process
_no_reads = threading.Event()
_no_reads.set()
_local = threading.local()  # a background round's (start, seconds paused), monotonic
RowT = TypeVar("RowT")


@contextmanager
def reading() -> Iterator[None]:
    """Mark an API read in flight for the block: background rounds give way meanwhile."""
    global _reads
    with _lock:
        _reads += 1
        _no_reads.clear()
    try:
        yield
    finally:
        with _lock:
            _reads -= 1
            if _reads == 0:
                _no_reads.set()


@contextmanager
def background_round() -> Iterator[None]:
    """Mark the calling thread as running a background round for the block (it gives way to
    reads at its statements and where it calls ``give_way``)."""
    _local.round = [time.monotonic(), 0.0]
    try:
        yield
    finally:
        _local.round = None


def give_way() -> float:
    """In a background round with reads in flight, wait until they end (within the round's
    allowance); returns the seconds waited (0 outside a round, or with no read in flight)."""
    if not _reads:
        return 0.0
    state: list[float] | None = getattr(_local, "round", None)
    if state is None:
        return 0.0
    started, paused = state
    now = time.monotonic()
    room = min(MAX_PAUSE_SECONDS, (now - started - paused) - paused)
    if room <= 0:
        return 0.0
    _no_reads.wait(room)
    waited = time.monotonic() - now
    state[1] = paused + waited
    return waited


def every_rows(rows: Iterable[RowT]) -> Iterator[RowT]:
    """``rows`` as they are, giving way to reads every ``ROWS_PER_LOOK`` of them."""
    for k, row in enumerate(rows, 1):
        if not k % ROWS_PER_LOOK:
            give_way()
        yield row


def _before_statement(*_: Any) -> None:
    give_way()


def give_way_at_statements(engine: Engine) -> None:
    """Make background rounds on ``engine`` give way to reads before each statement."""
    if not event.contains(engine, "before_cursor_execute", _before_statement):
        event.listen(engine, "before_cursor_execute", _before_statement)
