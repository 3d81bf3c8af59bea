"""``POST /api/v1/ingest``: batches of samples and processes from the agents."""

from __future__ import annotations

import time

import anyio
from fastapi import APIRouter, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from service import ingest as ingest_service
from service.api.deps import Agent, Ctx
from service.errors import WardenError
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


@router.post("/ingest", response_model=IngestResult)
async def ingest(request: Request, ctx: Ctx, token: Agent) -> IngestResult:
    """Store one batch whole, or reject it whole with a 4xx naming the item and the reason."""
    started = time.perf_counter()
    t = ctx.telemetry
    try:
        body = await request.body()
        # Validating and storing take a while: off the event loop (kept free for /healthz and
        # the other agents), on worker threads of ingest's own that reads cannot take.

        def decode_and_store() -> tuple[IngestBatch, IngestResult]:
            # One trip to a worker thread, not two: under load each trip waits a turn of the loop.
            batch = parse(body)
            return batch, ingest_service.ingest(ctx, batch, token_node=token.node)

        batch, result = await anyio.to_thread.run_sync(
            decode_and_store, limiter=request.app.state.admission.limiter("ingest")
        )
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
