"""Database outages answered 503 with Retry-After, logged once per outage instead of per request."""

from __future__ import annotations

import logging
import threading
import time

from fastapi import Request, status
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc

log = logging.getLogger(__name__)

# How long clients are told to wait; about the time a restarted PostgreSQL needs to accept again.
DB_RETRY_AFTER_SECONDS = 5
# While the database stays away, a reminder line at most this often (with the count of requests).
REMIND_SECONDS = 60.0

# Errors that mean "the database is not reachable or not answering now", not "this input is bad":
# lost or refused connections, a pool with no free connection, a statement timeout.
OUTAGE_ERRORS: tuple[type[Exception], ...] = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.DisconnectionError,
    sa_exc.TimeoutError,
)


class OutageLog:
    """Logs the first failure of an outage, then a reminder a minute, not one line per request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_logged = -float("inf")
        self._suppressed = 0

    def failed(self, exc: BaseException, where: str) -> None:
        """Record one request that failed because of ``exc``."""
        now = time.monotonic()
        with self._lock:
            if now - self._last_logged < REMIND_SECONDS:
                self._suppressed += 1
                return
            suppressed, self._suppressed, self._last_logged = self._suppressed, 0, now
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        log.warning(
            "database unavailable (%s at %s: %s); answering 503%s",
            type(getattr(exc, "orig", None) or exc).__name__,
            where,
            first_line[:300],
            f" ({suppressed} more requests since the last line)" if suppressed else "",
        )


async def database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """503 with Retry-After for a database that is down, restarting or out of connections."""
    if type(getattr(exc, "orig", None)).__name__ == "QueryCanceled":
        # A statement timeout: this request asked too much, the database itself is fine.
        request.app.state.ctx.telemetry.db_errors.labels("statement_timeout").inc()
        return JSONResponse(
            {"detail": "the query ran past the statement timeout; ask for a shorter range"},
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(DB_RETRY_AFTER_SECONDS)},
        )
    request.app.state.outage_log.failed(exc, request.url.path)
    request.app.state.ctx.telemetry.db_errors.labels("unavailable").inc()
    return JSONResponse(
        {"detail": "the database is unavailable right now; retry shortly"},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers={"Retry-After": str(DB_RETRY_AFTER_SECONDS)},
    )
