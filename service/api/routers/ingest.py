"""``POST /api/v1/ingest``: batches of samples and processes from the agents."""

from __future__ import annotations

import email.utils
import math
import threading
import time
from datetime import datetime

import anyio
from fastapi import APIRouter, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from service.api.deps import Agent, ApiState, AppState
from service.db.tokens_repo import TokenInfo
from service.errors import Unavailable, ValidationFailed, WardenError
from service.usecases import ingest as ingest_service
from service.wire import IngestBatch, IngestResult

router = APIRouter(tags=["ingest"])


def parse(body: bytes) -> IngestBatch:
    """Validate a body (made plain and held to its limit by the request guard); CPU-bound, so
    callers run it off the event loop."""
    try:
        return ingest_service.parse_batch(body)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        ) from exc


# The header in which a client says how long it waits for the answer (seconds).
TIMEOUT_HEADER = "X-Request-Timeout"


def sent_at(request: Request) -> datetime | None:
    """When the agent sent the batch, by its clock (the HTTP Date header), or None when it
    sent none or an unreadable one (older agents send none: their clock is not measured)."""
    raw = request.headers.get("date")
    if not raw:
        return None
    try:
        at = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return at if at.tzinfo is not None else None


def client_timeout(request: Request) -> float | None:
    """The client's X-Request-Timeout in seconds, or None when it sent none; 422 if malformed."""
    raw = request.headers.get(TIMEOUT_HEADER)
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValidationFailed(TIMEOUT_HEADER, f"must be a positive number of seconds, got {raw!r}")
    return seconds


async def _watch_disconnect(
    request: Request, gone: threading.Event, wait: anyio.CancelScope
) -> None:
    # The body is read: the next message is http.disconnect, once the client goes away.
    while (await request.receive())["type"] != "http.disconnect":
        pass
    gone.set()
    wait.cancel()


@router.post("/ingest", response_model=IngestResult)
async def ingest(request: Request, app_state: AppState, token: Agent) -> IngestResult:
    """Store one batch whole, or reject it whole with a 4xx naming the item and the reason; 503
    with Retry-After (nothing stored) when no slot frees in time or the client gave up."""
    started = time.perf_counter()
    t = app_state.ctx.telemetry
    timeout = client_timeout(request)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        body = await request.body()
        gone = threading.Event()
        wait = anyio.CancelScope()
        stored: tuple[IngestBatch, IngestResult] | Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(_watch_disconnect, request, gone, wait)
            try:
                stored = await _store(request, app_state, token, body, wait, gone, deadline)
            except Exception as exc:  # raised below, not wrapped in the task group's group
                stored = exc
            finally:
                tg.cancel_scope.cancel()
        if isinstance(stored, Exception):
            raise stored
        assert stored is not None
        batch, result = stored
    except Unavailable:
        t.ingest_batches.labels("refused").inc()
        raise
    except (RequestValidationError, WardenError, HTTPException):
        # HTTPException: the request guard refused the body (413, 422 not gzip, 503 budget).
        t.ingest_batches.labels("rejected").inc()
        raise
    except Exception:
        t.ingest_batches.labels("error").inc()
        t.db_errors.labels("ingest").inc()
        raise
    t.ingest_batches.labels("stored").inc()
    t.ingest_samples.inc(result.samples_received)
    t.ingest_values.inc(sum(len(s.metrics.model_fields_set) for s in batch.samples))
    t.ingest_seconds.observe(time.perf_counter() - started)
    return result


async def _store(
    request: Request,
    app_state: ApiState,
    token: TokenInfo,
    body: bytes,
    wait: anyio.CancelScope,
    gone: threading.Event,
    deadline: float | None,
) -> tuple[IngestBatch, IngestResult]:
    """Wait a bounded time for an ingest slot, then validate and store off the event loop."""
    ctx = app_state.ctx
    wait_seconds = ctx.settings.ingest_wait_seconds
    if deadline is not None:
        # Half the client's time for waiting, the rest for storing and the answer.
        timeout = float(request.headers[TIMEOUT_HEADER])
        wait_seconds = min(wait_seconds, max(0.0, deadline - time.monotonic() - timeout / 2))

    def given_up() -> str | None:
        if gone.is_set():
            return "the client closed the connection"
        if deadline is not None and time.monotonic() >= deadline:
            return f"the client's {TIMEOUT_HEADER} has passed"
        return None

    def decode_and_store() -> tuple[IngestBatch, IngestResult]:
        # One trip to a worker thread, not two: under load each trip waits a turn of the loop.
        batch = parse(body)
        return batch, ingest_service.ingest(
            ctx, batch, token_node=token.node, given_up=given_up, sent_at=sent_at(request)
        )

    admission = app_state.admission
    async with admission.ingest_slot(wait_seconds, wait):
        # Validating and storing take a while: off the event loop (kept free for /healthz and
        # the other agents), on worker threads of ingest's own that reads cannot take.
        return await anyio.to_thread.run_sync(decode_and_store, limiter=admission.limiter("ingest"))
