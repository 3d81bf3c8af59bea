"""``POST /api/v1/ingest``: batches of samples and processes from the agents."""

from __future__ import annotations

import time

import anyio
from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from service import ingest as ingest_service
from service.api.deps import Agent, Ctx
from service.errors import PayloadTooLarge, WardenError
from service.wire import IngestBatch, IngestResult

router = APIRouter(tags=["ingest"])


async def read_limited(request: Request, max_bytes: int) -> bytes:
    """The request body, refused with PayloadTooLarge as soon as it passes ``max_bytes``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"body is {declared} bytes; the limit is {max_bytes}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"body exceeds the limit of {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def decode_and_parse(body: bytes, *, content_encoding: str | None, max_bytes: int) -> IngestBatch:
    """Gunzip and validate a body; CPU-bound, so callers run it off the event loop."""
    raw = ingest_service.decode_body(body, content_encoding=content_encoding, max_bytes=max_bytes)
    try:
        return ingest_service.parse_batch(raw)
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
        body = await read_limited(request, ctx.settings.ingest_max_body_bytes)
        # Decompressing, validating and storing take a while: off the event loop (kept free for
        # /healthz and the other agents), on worker threads of ingest's own that reads cannot take.
        content_encoding = request.headers.get("content-encoding")
        max_bytes = ctx.settings.ingest_max_body_bytes

        def decode_and_store() -> tuple[IngestBatch, IngestResult]:
            # One trip to a worker thread, not two: under load each trip waits a turn of the loop.
            batch = decode_and_parse(body, content_encoding=content_encoding, max_bytes=max_bytes)
            return batch, ingest_service.ingest(ctx, batch, token_node=token.node)

        batch, result = await anyio.to_thread.run_sync(
            decode_and_store, limiter=request.app.state.admission.limiter("ingest")
        )
    except (RequestValidationError, WardenError):
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
