"""Reads first: a background round pauses at its statements and in its long loops while an API
read runs in this process, so a page does not share the interpreter lock with a rollup.

One process runs its API reads and its background rounds (rollups, useful work, today's sums)
on threads of one interpreter; a round's pure-Python loops hold the lock for hundreds of ms,
and a page read waiting for it took 3 s at worst on a 2-core machine mostly idle (3,000 GPUs,
docs/benchmarks.md). A round gives way only while reads are in flight, for at most
``MAX_PAUSE_SECONDS`` at a time and never longer in all than it has run (so it takes at most
twice its time), and only at points between its statements or rows, never inside a database
call.

A pause never holds another writer up: a round does not pause while a transaction of its
thread holds writes another writer could wait for. On SQLite that is any write (one writer
holds the whole database). On PostgreSQL readers never wait for writes, so only a round that
writes rows someone else may write too is held back (``own_rows=False``, the default); a round
whose rows no one else writes (the rollup's) may pause holding them.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, event

# The longest a round waits for reads at one point (a read that takes longer shares the lock).
MAX_PAUSE_SECONDS = 1.0
# Rows a round's loop handles between two looks at whether reads are in flight.
ROWS_PER_LOOK = 512
# A statement that only reads: it starts as a read and names no write or row lock (a
# data-modifying CTE, SELECT ... FOR UPDATE/SHARE). Anything else counts as a write.
_READ_START = re.compile(r"\s*(SELECT|WITH|SHOW|SET|SAVEPOINT|RELEASE|VALUES)\b", re.IGNORECASE)
_WRITE_WORD = re.compile(r"\b(INSERT|UPDATE|DELETE|MERGE|SHARE)\b", re.IGNORECASE)
# Connection.info key: this connection's open transaction holds writes that stop a writer.
_HOLDS = "foreground_holds_writes"

_lock = threading.Lock()
_reads = 0  # API reads in flight in this process
_no_reads = threading.Event()
_no_reads.set()
_local = threading.local()  # .round: this thread's _Round, or None
RowT = TypeVar("RowT")


@dataclass(slots=True)
class _Round:
    """A background round on this thread: its start and its pauses (monotonic seconds), whether
    its rows are its own, and how many of its connections hold writes that stop a writer."""

    started: float
    own_rows: bool
    paused_seconds: float = 0.0
    connections_holding_writes: int = 0

    def allowance_seconds(self, now: float) -> float:
        """How long it may pause now (s): at most ``MAX_PAUSE_SECONDS``, and never so long that
        its pauses in all exceed the time it has worked."""
        worked = now - self.started - self.paused_seconds
        return min(MAX_PAUSE_SECONDS, worked - self.paused_seconds)


def _current() -> _Round | None:
    round_: _Round | None = getattr(_local, "round", None)
    return round_


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
def background_round(*, own_rows: bool = False) -> Iterator[None]:
    """Mark the calling thread as running a background round for the block (it gives way to
    reads at its statements and where it calls ``give_way``); ``own_rows``: no one else writes
    the rows it writes, so on PostgreSQL it may pause holding them."""
    _local.round = _Round(started=time.monotonic(), own_rows=own_rows)
    try:
        yield
    finally:
        _local.round = None


def give_way() -> float:
    """In a background round with reads in flight, wait until they end (within the round's
    allowance); returns the seconds waited (0 outside a round, with no read in flight, or
    while the round holds writes another writer could wait for)."""
    if not _reads:
        return 0.0
    round_ = _current()
    if round_ is None or round_.connections_holding_writes:
        return 0.0
    now = time.monotonic()
    room = round_.allowance_seconds(now)
    if room <= 0:
        return 0.0
    _no_reads.wait(room)
    waited = time.monotonic() - now
    round_.paused_seconds += waited
    return waited


def every_rows(rows: Iterable[RowT]) -> Iterator[RowT]:
    """``rows`` as they are, giving way to reads every ``ROWS_PER_LOOK`` of them."""
    for k, row in enumerate(rows, 1):
        if not k % ROWS_PER_LOOK:
            give_way()
        yield row


def is_write(statement: str) -> bool:
    """Whether ``statement`` may write or lock rows (anything not plainly a read)."""
    return not _READ_START.match(statement) or bool(_WRITE_WORD.search(statement))


def wrote(conn: Connection) -> None:
    """Note that ``conn``'s open transaction now holds writes made outside SQLAlchemy's
    statements (a COPY through the driver), so its round stops giving way until it ends."""
    round_ = _current()
    if round_ is None or conn.info.get(_HOLDS):
        return
    if conn.dialect.name == "sqlite" or not round_.own_rows:
        conn.info[_HOLDS] = True
        round_.connections_holding_writes += 1


def _released(info: dict[Any, Any]) -> None:
    if info.pop(_HOLDS, False) and (round_ := _current()) is not None:
        round_.connections_holding_writes = max(0, round_.connections_holding_writes - 1)


def _before_statement(conn: Connection, _cursor: Any, statement: str, *_: Any) -> None:
    if _current() is None:
        return  # not a background round (an API request, ingest): nothing to look at
    give_way()
    if is_write(statement):
        wrote(conn)


def _transaction_ended(conn: Connection) -> None:
    _released(conn.info)


def _checked_in(_dbapi: Any, record: Any) -> None:
    _released(record.info)  # returned to the pool: its transaction was rolled back


_HOOKS = (
    ("before_cursor_execute", _before_statement),
    ("commit", _transaction_ended),
    ("rollback", _transaction_ended),
    ("checkin", _checked_in),
)


def give_way_at_statements(engine: Engine) -> None:
    """Make background rounds on ``engine`` give way to reads before each statement, except
    while a transaction of theirs holds writes that stop another writer."""
    for name, hook in _HOOKS:
        if not event.contains(engine, name, hook):
            event.listen(engine, name, hook)


def stop_giving_way(engine: Engine) -> None:
    """Undo ``give_way_at_statements`` on ``engine``."""
    for name, hook in _HOOKS:
        if event.contains(engine, name, hook):
            event.remove(engine, name, hook)
