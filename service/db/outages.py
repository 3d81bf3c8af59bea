"""Telling a database outage from other errors, and logging one without a line per failure."""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import exc as sa_exc

# Errors that mean "the database is not reachable or not answering now", not "this input is bad":
# lost or refused connections, a pool with no free connection, a statement timeout.
OUTAGE_ERRORS: tuple[type[Exception], ...] = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.DisconnectionError,
    sa_exc.TimeoutError,
)
# While the database stays away, a reminder line at most this often (with the count of failures).
REMIND_SECONDS = 60.0


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says the database is unreachable or overloaded rather than a bug."""
    return isinstance(exc, OUTAGE_ERRORS)


class OutageLog:
    """Logs the first failure of an outage, then a reminder a minute, without tracebacks."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self.logger = logger
        self.what = what
        self._lock = threading.Lock()
        self._last_logged = -float("inf")
        self._suppressed = 0

    def failed(self, exc: BaseException, where: str) -> None:
        """Record one failure caused by ``exc`` at ``where``."""
        now = time.monotonic()
        with self._lock:
            if now - self._last_logged < REMIND_SECONDS:
                self._suppressed += 1
                return
            suppressed, self._suppressed, self._last_logged = self._suppressed, 0, now
        text = str(exc).strip()
        first_line = text.splitlines()[0] if text else ""
        self.logger.warning(
            "database unavailable (%s at %s: %s); %s%s",
            type(getattr(exc, "orig", None) or exc).__name__,
            where,
            first_line[:300],
            self.what,
            f" ({suppressed} more failures since the last line)" if suppressed else "",
        )
