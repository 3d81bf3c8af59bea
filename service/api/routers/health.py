"""Liveness, readiness and the Prometheus /metrics endpoint."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status
from fastapi.responses import JSONResponse
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from service.api.deps import Ctx, authenticated
from service.api.query import query_error
from service.db.migrate import check_at_head
from service.db.tokens_repo import Role
from service.errors import SchemaOutOfDate
from service.exposition.render import Joined, render
from service.exposition.shards import parse_shard
from service.usecases.metrics_endpoint import FleetCollector

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


SHARD_HELP = (
    "i/n: only the GPUs of the nodes in shard i of n (each node in one shard); shard 0 also "
    "carries the fleet-wide families and the service's own (docs/prometheus-grafana.md)"
)


@router.get("/metrics")
async def metrics(
    request: Request,
    ctx: Ctx,
    shard: Annotated[str | None, Query(description=SHARD_HELP)] = None,
) -> Response:
    """Prometheus exposition of the fleet and of the service itself, whole or in shards."""
    try:
        part = None if shard is None else parse_shard(shard)
    except ValueError as exc:
        raise query_error("shard", str(exc)) from None
    if ctx.settings.metrics_token_required:
        info = await authenticated(request, ctx)
        if info.role not in (Role.READER, Role.ADMIN) or info.scope is not None:
            return Response("a reader token is needed", status.HTTP_403_FORBIDDEN)
    # The fleet families read the database: off the event loop. The replica's lag is measured
    # first (when due), so its gauges in this scrape are current.
    await run_in_threadpool(ctx.reads.state)
    # The fleet's families are read from the database at scrape time.
    fleet = FleetCollector(ctx, part)
    collector = fleet if part is not None and not part.carries_fleet else None
    body, content_type = await run_in_threadpool(
        render, collector or Joined(ctx.telemetry.registry, fleet)
    )
    return Response(body, headers={"Content-Type": content_type})
