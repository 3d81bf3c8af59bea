"""Database outages answered 503 with Retry-After, logged once per outage instead of per request."""

from __future__ import annotations

import logging

from fastapi import Request, status
from fastapi.responses import JSONResponse

from service.db.outages import OUTAGE_ERRORS, OutageLog

__all__ = ["OUTAGE_ERRORS", "database_unavailable", "request_outage_log"]

log = logging.getLogger(__name__)

# How long clients are told to wait; about the time a restarted PostgreSQL needs to accept again.
DB_RETRY_AFTER_SECONDS = 5


def request_outage_log() -> OutageLog:
    """The app's log of requests answered 503 because the database is away."""
    return OutageLog(log, "answering 503")


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
