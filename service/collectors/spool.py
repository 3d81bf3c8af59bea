"""The on-disk spool: an SQLite queue of encoded polls, bounded in bytes, oldest dropped first.

Every poll is written here as it is taken and leaves only once central took it (or it was
dead-lettered). Each write commits before returning (WAL, synchronous=NORMAL survives a killed
process), so a ``kill -9`` of the agent loses at most the poll it was taking.

An entry refused by server errors again and again is set aside: it waits until ``not_before``
while newer entries go first, and is tried again after that; it is never dropped for it.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MAX_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Entry:
    """One spooled body, its other-5xx answers in a row, and when it was spooled (Unix s)."""

    id: int
    body: bytes
    server_errors: int
    created_at: float


class Spool:
    """A FIFO of bodies on disk, at most ``max_bytes`` of bodies in total."""

    def __init__(self, path: Path | str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.path = str(path)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS batches ("
            " id INTEGER PRIMARY KEY AUTOINCREMENT,"
            " created_at REAL NOT NULL,"
            " size INTEGER NOT NULL,"
            " body BLOB NOT NULL)"
        )
        columns = {r[1] for r in self._db.execute("PRAGMA table_info(batches)")}
        # Spools written by older agents lack the columns of the set-aside rule: add them.
        if "server_errors" not in columns:
            self._db.execute(
                "ALTER TABLE batches ADD COLUMN server_errors INTEGER NOT NULL DEFAULT 0"
            )
        if "not_before" not in columns:
            self._db.execute("ALTER TABLE batches ADD COLUMN not_before REAL NOT NULL DEFAULT 0")
        row = self._db.execute("SELECT count(*), coalesce(sum(size), 0) FROM batches").fetchone()
        self.depth = int(row[0])
        self.bytes = int(row[1])
        self.dropped_total = 0

    def push(self, body: bytes, *, now: float) -> int:
        """Append ``body`` spooled at ``now`` (Unix s); returns how many oldest were dropped."""
        size = len(body)
        dropped = 0
        with self._lock:
            if size > self.max_bytes:
                self.dropped_total += 1
                return 1  # a single body larger than the whole spool can never fit
            self._db.execute("BEGIN IMMEDIATE")
            try:
                while self.bytes + size > self.max_bytes and self.depth > 0:
                    oldest = self._db.execute(
                        "SELECT id, size FROM batches ORDER BY id LIMIT 1"
                    ).fetchone()
                    self._db.execute("DELETE FROM batches WHERE id = ?", (oldest[0],))
                    self.bytes -= int(oldest[1])
                    self.depth -= 1
                    dropped += 1
                self._db.execute(
                    "INSERT INTO batches (created_at, size, body) VALUES (?, ?, ?)",
                    (now, size, body),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self.bytes += size
            self.depth += 1
            self.dropped_total += dropped
        return dropped

    def due(self, *, now: float, limit: int) -> list[Entry]:
        """Up to ``limit`` entries not set aside past ``now`` (Unix s), oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, body, server_errors, created_at FROM batches"
                " WHERE not_before <= ? ORDER BY id LIMIT ?",
                (now, limit),
            ).fetchall()
        return [Entry(int(r[0]), bytes(r[1]), int(r[2]), float(r[3])) for r in rows]

    def note_server_errors(self, ids: Iterable[int], count: int, *, not_before: float) -> None:
        """Record ``count`` server errors in a row for ``ids``; they wait until ``not_before``."""
        with self._lock:
            self._db.executemany(
                "UPDATE batches SET server_errors = ?, not_before = ? WHERE id = ?",
                [(count, not_before, i) for i in ids],
            )

    def remove(self, ids: Iterable[int]) -> None:
        """Delete the entries ``ids`` (delivered or dead-lettered)."""
        with self._lock:
            freed, gone = 0, 0
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for batch_id in ids:
                    row = self._db.execute(
                        "DELETE FROM batches WHERE id = ? RETURNING size", (batch_id,)
                    ).fetchone()
                    if row is not None:
                        freed += int(row[0])
                        gone += 1
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self.bytes -= freed
            self.depth -= gone

    def close(self) -> None:
        """Close the database file."""
        with self._lock:
            self._db.close()
