"""The on-disk spool: an SQLite queue of encoded batches, bounded in bytes, oldest dropped first.

Every write commits before returning (WAL, synchronous=NORMAL survives a killed process), so a
``kill -9`` of the agent loses only the batch it held in memory, never a spooled one.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

DEFAULT_MAX_BYTES = 256 * 1024 * 1024


class Spool:
    """A FIFO of batch bodies on disk, at most ``max_bytes`` of bodies in total."""

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
        row = self._db.execute("SELECT count(*), coalesce(sum(size), 0) FROM batches").fetchone()
        self.depth = int(row[0])
        self.bytes = int(row[1])
        self.dropped_total = 0

    def push(self, body: bytes) -> int:
        """Append ``body``; returns how many oldest batches were dropped to stay in bounds."""
        size = len(body)
        dropped = 0
        with self._lock:
            if size > self.max_bytes:
                self.dropped_total += 1
                return 1  # a single batch larger than the whole spool can never fit
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
                    (time.time(), size, body),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self.bytes += size
            self.depth += 1
            self.dropped_total += dropped
        return dropped

    def oldest(self) -> tuple[int, bytes] | None:
        """The id and body of the oldest batch, or None when empty."""
        with self._lock:
            row = self._db.execute("SELECT id, body FROM batches ORDER BY id LIMIT 1").fetchone()
        return (int(row[0]), bytes(row[1])) if row else None

    def remove(self, batch_id: int) -> None:
        """Delete batch ``batch_id`` (after it was delivered or dead-lettered)."""
        with self._lock:
            row = self._db.execute("SELECT size FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is None:
                return
            self._db.execute("DELETE FROM batches WHERE id = ?", (batch_id,))
            self.bytes -= int(row[0])
            self.depth -= 1

    def close(self) -> None:
        """Close the database file."""
        with self._lock:
            self._db.close()
