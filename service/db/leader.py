"""Leader election among central replicas (a PostgreSQL session advisory lock held open; on
SQLite an OS lock on a file beside the database), and turns for background jobs that one
replica at a time may run."""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine, text

from service.db.outages import OutageLog, is_outage

log = logging.getLogger(__name__)

# Any fixed 64-bit key shared by every replica: "gpuwarden-evaluator".
LOCK_KEY = 0x67707577_6576616C


def sqlite_lock_path(engine: Engine) -> str | None:
    """The leader lock file of a SQLite database (``<file>.leader.lock``); None for an
    in-memory one, which no other process can open."""
    database = engine.url.database or ""
    if not database or database == ":memory:" or "mode=memory" in str(engine.url):
        return None
    if database.startswith("file:"):
        database = database[len("file:") :].split("?", 1)[0]
    return os.path.abspath(database) + ".leader.lock"


class LeaderLock:
    """Whether this process may evaluate and send (and so run the ladder).

    On PostgreSQL the lock belongs to one dedicated session: when the process dies, the server
    closes that session and releases the lock, and the next replica to ask takes over. On SQLite
    it is an exclusive ``flock`` on a file beside the database, held open: a second ``serve`` on
    the same file serves reads and ingest but never acts, and the OS frees the lock when the
    first process dies, so the next ``check`` takes over.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._conn: Connection | None = None
        self._mutex = threading.Lock()
        self.acquisitions = 0  # bumped each time the lock is taken (anew)
        self._outages = OutageLog(log, "the evaluator waits for the database")
        self._postgres = engine.dialect.name == "postgresql"
        self._lock_path = None if self._postgres else sqlite_lock_path(engine)
        self._fd: int | None = None
        self._told_follower = False

    def check(self) -> bool:
        """Take the lock if free, or confirm the session holding it is alive; True if leader."""
        if not self._postgres:
            return self._check_file()
        with self._mutex:
            try:
                if self._conn is not None:
                    self._conn.execute(text("SELECT 1"))
                    self._conn.commit()
                    return True
                conn = self.engine.connect()
                got = conn.execute(
                    text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY}
                ).scalar()
                conn.commit()
                if got:
                    log.info("this replica is now the evaluator (advisory lock taken)")
                    self._conn = conn
                    self.acquisitions += 1
                    return True
                conn.close()
                return False
            except Exception as exc:
                if is_outage(exc):
                    self._outages.failed(exc, "the evaluator's leader lock")
                else:
                    log.warning("leader lock session lost; will try again", exc_info=True)
                self._drop()
                return False

    def _check_file(self) -> bool:
        """SQLite: hold the lock file (taken once, kept open) or say which process does not."""
        if self._lock_path is None:
            return True
        with self._mutex:
            if self._fd is not None:
                return True
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                self._tell_follower()
                return False
            self._fd = fd
            self.acquisitions += 1
            was = "took over: " if self._told_follower else ""
            log.info(
                "this process is now the evaluator (%slock file %s held)", was, self._lock_path
            )
            self._told_follower = False
            return True

    def _tell_follower(self) -> None:
        """Log once why this process does not evaluate or act."""
        if self._told_follower:
            return
        self._told_follower = True
        log.warning(
            "another process serves this SQLite database and holds %s: this one serves reads "
            "and ingest but does not evaluate alerts, send notices or run the ladder; it takes "
            "over if that process exits (SQLite suits one process; use PostgreSQL for replicas)",
            self._lock_path,
        )

    @property
    def held(self) -> bool:
        """Whether this process held the lock at its last ``check`` (asks the database nothing)."""
        if not self._postgres:
            return self._lock_path is None or self._fd is not None
        return self._conn is not None

    def release(self) -> None:
        """Give the lock up (on shutdown) so another replica takes over at once."""
        if not self._postgres:
            with self._mutex:
                if self._fd is not None:
                    os.close(self._fd)  # closing the only descriptor frees the flock
                    self._fd = None
            return
        with self._mutex:
            if self._conn is not None:
                try:
                    self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
                    self._conn.commit()
                except Exception:
                    log.warning("could not release the leader lock cleanly", exc_info=True)
                self._drop()

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.invalidate()
                self._conn.close()
            except Exception:
                log.debug("closing the lost leader session failed", exc_info=True)
        self._conn = None


def job_lock_key(name: str) -> int:
    """The advisory lock key (a signed 64-bit integer) of background job ``name``."""
    digest = hashlib.blake2b(f"gpuwarden-job:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@contextmanager
def job_turn(engine: Engine, name: str) -> Iterator[bool]:
    """Whether this replica may run background job ``name`` now: True while no other replica
    runs it (SQLite: one process, always). The lock lives in a session held for the run, so a
    replica that dies mid-run gives the turn back with its connection."""
    if engine.dialect.name != "postgresql":
        yield True
        return
    key = job_lock_key(name)
    with engine.connect() as conn:
        got = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar())
        conn.commit()
        try:
            yield got
        finally:
            if got:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                conn.commit()
