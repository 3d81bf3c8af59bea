"""Liveness, readiness and the Prometheus /metrics endpoint."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status
from fastapi.responses import JSONResponse
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from service.api.deps import Ctx, authenticated
from service.db.migrate import check_at_head
from service.db.tokens_repo import Role
from service.errors import SchemaOutOfDate
from service.exposition.render import render

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz(ctx: Ctx) -> dict[str, object]:
    """Liveness: the process is up and serving; with a read replica configured, also its lag
    (``read_replica``: status ok, lagging, down or not_replicating; lag in seconds and bytes)."""
    replica = ctx.reads.state()
    if replica is None:
        return {"status": "ok"}
    return {"status": "ok", "read_replica": replica.as_dict()}


@router.get("/readyz")
def readyz(ctx: Ctx) -> JSONResponse:
    """Readiness: the database answers and its schema is at head."""
    try:
        with ctx.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        check_at_head(ctx.engine)
    except SchemaOutOfDate as exc:
        return JSONResponse(
            {"status": "unready", "detail": str(exc)}, status.HTTP_503_SERVICE_UNAVAILABLE
        )
    except Exception as exc:
        ctx.telemetry.db_errors.labels("readyz").inc()
        return JSONResponse(
            {"status": "unready", "detail": f"database unreachable: {type(exc).__name__}"},
            status.HTTP_503_SERVICE_UNAVAILABLE,
        )
    return JSONResponse({"status": "ready"})


@router.get("/metrics")
async def metrics(request: Request, ctx: Ctx) -> Response:
    """Prometheus exposition of the fleet and of the service itself."""
    if ctx.settings.metrics_token_required:
        info = await authenticated(request, ctx)
        if info.role not in (Role.READER, Role.ADMIN):
            return Response("a reader token is needed", status.HTTP_403_FORBIDDEN)
    # The fleet families read the database: off the event loop. The replica's lag is measured
    # first (when due), so its gauges in this scrape are current.
    await run_in_threadpool(ctx.reads.state)
    body, content_type = await run_in_threadpool(render, ctx.telemetry.registry)
    return Response(body, headers={"Content-Type": content_type})
