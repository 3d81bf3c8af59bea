"""The on-disk spool: an SQLite queue of gzipped polls, bounded in bytes, oldest dropped first.

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
    """One spooled body, its other-5xx answers in a row, when it was spooled (Unix s), and its
    samples and processes (-1: not known, as in spools of older agents)."""

    id: int
    body: bytes
    server_errors: int
    created_at: float
    samples: int = -1
    processes: int = -1


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
        # Spools written by older agents lack the newer columns: add them.
        for name, decl in (
            ("server_errors", "INTEGER NOT NULL DEFAULT 0"),
            ("not_before", "REAL NOT NULL DEFAULT 0"),
            ("samples", "INTEGER NOT NULL DEFAULT -1"),
            ("processes", "INTEGER NOT NULL DEFAULT -1"),
        ):
            if name not in columns:
                self._db.execute(f"ALTER TABLE batches ADD COLUMN {name} {decl}")
        # Job ends the Slurm epilog handed over: kept until central took them, one per job.
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS job_ends ("
            " job_id TEXT PRIMARY KEY,"
            " ended_at TEXT NOT NULL,"
            " created_at REAL NOT NULL)"
        )
        row = self._db.execute("SELECT count(*), coalesce(sum(size), 0) FROM batches").fetchone()
        self.depth = int(row[0])
        self.bytes = int(row[1])
        self.dropped_total = 0
        self._oldest: float | None = None  # created_at of the oldest entry, None: look it up

    def push(self, body: bytes, *, now: float, samples: int = -1, processes: int = -1) -> int:
        """Append ``body`` spooled at ``now`` (Unix s); returns how many oldest were dropped."""
        size = len(body)
        dropped = 0
        row = (now, size, body, samples, processes)
        insert = (
            "INSERT INTO batches (created_at, size, body, samples, processes)"
            " VALUES (?, ?, ?, ?, ?)"
        )
        with self._lock:
            if size > self.max_bytes:
                self.dropped_total += 1
                return 1  # a single body larger than the whole spool can never fit
            if self.bytes + size <= self.max_bytes:
                self._db.execute(insert, row)  # one statement: its own transaction
                if self.depth == 0:
                    self._oldest = now
                self.bytes += size
                self.depth += 1
                return 0
            self._oldest = None
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
                self._db.execute(insert, row)
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
                "SELECT id, body, server_errors, created_at, samples, processes FROM batches"
                " WHERE not_before <= ? ORDER BY id LIMIT ?",
                (now, limit),
            ).fetchall()
        return [
            Entry(int(r[0]), bytes(r[1]), int(r[2]), float(r[3]), int(r[4]), int(r[5]))
            for r in rows
        ]

    def oldest_created_at(self) -> float | None:
        """When the oldest entry was spooled (Unix s), None when empty; cached between writes."""
        with self._lock:
            if self.depth == 0:
                return None
            if self._oldest is None:
                row = self._db.execute("SELECT min(created_at) FROM batches").fetchone()
                self._oldest = float(row[0])
            return self._oldest

    def note_server_errors(self, ids: Iterable[int], count: int, *, not_before: float) -> None:
        """Record ``count`` server errors in a row for ``ids``; they wait until ``not_before``."""
        with self._lock:
            self._db.executemany(
                "UPDATE batches SET server_errors = ?, not_before = ? WHERE id = ?",
                [(count, not_before, i) for i in ids],
            )

    def remove(self, ids: Iterable[int]) -> None:
        """Delete the entries ``ids`` (delivered or dead-lettered)."""
        wanted = list(ids)
        with self._lock:
            # One statement, so one transaction, whatever the number of entries.
            sizes = self._db.execute(
                f"DELETE FROM batches WHERE id IN ({','.join('?' * len(wanted))}) RETURNING size",
                wanted,
            ).fetchall()
            self.bytes -= sum(int(r[0]) for r in sizes)
            self.depth -= len(sizes)
            self._oldest = None

    def add_job_end(self, job_id: str, ended_at: str, *, now: float) -> None:
        """Keep the end of ``job_id`` at ``ended_at`` (RFC 3339) to ship; the first end wins."""
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO job_ends (job_id, ended_at, created_at) VALUES (?, ?, ?)",
                (job_id, ended_at, now),
            )

    def job_ends(self) -> list[tuple[str, str]]:
        """The job ends not shipped yet, as (job id, ended_at), oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT job_id, ended_at FROM job_ends ORDER BY created_at, job_id"
            ).fetchall()
        return [(str(r[0]), str(r[1])) for r in rows]

    def remove_job_end(self, job_id: str) -> None:
        """Forget the end of ``job_id`` (central took it, or it can never be taken)."""
        with self._lock:
            self._db.execute("DELETE FROM job_ends WHERE job_id = ?", (job_id,))

    def close(self) -> None:
        """Close the database file."""
        with self._lock:
            self._db.close()
