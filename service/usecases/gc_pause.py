"""The cyclic garbage collector held off while a report builds tens of thousands of objects.

A report by job makes a Summary (with its sets and lists) per row: 50,000 rows made the
collector walk the growing heap again and again, a third of the report's time. Reports make
no reference cycles, so reference counting frees everything they drop meanwhile. The
collector is process-wide: it starts again when the last report running in any thread ends.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_holders = 0  # reports inside gc_paused now, in every thread
_was_enabled = True  # whether the collector was on when the first of them entered


@contextmanager
def gc_paused() -> Iterator[None]:
    """Hold off the cyclic collector inside the block (if it was on when the first holder
    entered)."""
    global _holders, _was_enabled
    with _lock:
        _holders += 1
        if _holders == 1:
            _was_enabled = gc.isenabled()
            gc.disable()
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_enabled:
                gc.enable()
