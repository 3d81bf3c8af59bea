"""Statements run on a connection of their own beside the caller's, so that PostgreSQL works on
both at once while the caller goes on (a report's reads that do not depend on each other)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Self, TypeVar

from sqlalchemy import Connection

T = TypeVar("T")


class Beside:
    """Work handed over with ``submit`` runs in order on one connection of its own, in a
    thread, from the first call on; without ``enabled`` (SQLite, small work) each runs on the
    caller's connection when its result is asked for. Leaving the block waits for the work
    and gives the connection back."""

    def __init__(self, conn: Connection, *, enabled: bool) -> None:
        self.conn = conn
        self.enabled = enabled and conn.dialect.name == "postgresql"
        self._pool: ThreadPoolExecutor | None = None
        self._own: Connection | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._own is not None:
            self._own.close()

    def submit(self, work: Callable[[Connection], T], *, here: bool = False) -> Callable[[], T]:
        """A call that returns ``work``'s result: started now beside the caller, or (``here``,
        or not enabled) run on the caller's connection when called."""
        if here or not self.enabled:
            return lambda: work(self.conn)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1)
        future: Future[T] = self._pool.submit(self._run, work)
        return future.result

    def _run(self, work: Callable[[Connection], T]) -> T:
        if self._own is None:
            self._own = self.conn.engine.connect()
        return work(self._own)
