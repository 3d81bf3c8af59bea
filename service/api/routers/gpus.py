"""``/api/v1/gpus``: the fleet and each GPU's series."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Response, status

from service.api import query
from service.api.deps import Ctx, Expensive, ReadConn, Reader
from service.api.schemas.gpus import GpuMovePublic, GpuPublic, SeriesPublic
from service.db import gpus_repo
from service.usecases.fleet import with_states
from service.vocabulary import METRICS_BY_NAME

router = APIRouter(prefix="/gpus", tags=["gpus"])

MAX_POINTS = 11_000  # like Prometheus: refuse queries that would return more points


@router.get("", response_model=list[GpuPublic])
def list_gpus(
    ctx: Ctx, conn: ReadConn, _: Reader, node: str | None = None, model: str | None = None
) -> list[dict[str, object]]:
    """Every GPU with its node, model, last-seen time, latest values and state now."""
    return with_states(gpus_repo.list_gpus(conn, node=node, model=model), now=ctx.clock())


@router.get("/{uuid}/moves", response_model=list[GpuMovePublic])
def gpu_moves(uuid: str, conn: ReadConn, _: Reader) -> list[dict[str, Any]]:
    """The GPU's history of nodes: each move to a node that reported it, oldest first."""
    gpu_id = gpus_repo.gpu_id_by_uuid(conn, uuid=uuid)
    if gpu_id is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no GPU with uuid {uuid!r}")
    return gpus_repo.moves(conn, gpu_id=gpu_id)


@router.get("/{uuid}/series", response_model=SeriesPublic, dependencies=[Expensive])
def gpu_series(
    uuid: str,
    ctx: Ctx,
    conn: ReadConn,
    _: Reader,
    metric: str = Query(
        description="a canonical metric name, e.g. sm_active, or activity (the ladder: "
        "sm_active, else gr_engine_active, else gpu_util)"
    ),
    start: str | None = Query(None, description=f"{query.TIME_HELP}; default end - 1h"),
    end: str | None = Query(None, description=f"{query.TIME_HELP}; default now"),
    since: str | None = Query(None, description=query.SINCE_HELP),
    step: str | None = Query(
        None, description="per point: 10s, 5m or seconds; default about 300 points"
    ),
) -> Response:
    """One metric of one GPU over [start, end), read from raw, 1m or 1h data as step allows."""
    units = {name: spec.unit for name, spec in METRICS_BY_NAME.items()} | {"activity": "ratio"}
    unit = units.get(metric)
    if unit is None:
        raise query.query_error("metric", f"unknown metric {metric!r}; known: {', '.join(units)}")
    start_at, end_at = query.window(
        start=start, end=end, since=since, now=ctx.clock(), default_seconds=3600
    )
    span = (end_at - start_at).total_seconds()
    step_seconds = query.seconds("step", step) or max(span / 300, 1.0)
    if span / step_seconds > MAX_POINTS:
        raise query.query_error(
            "step",
            f"{span / step_seconds:.0f} points requested; at most {MAX_POINTS}, "
            "so use a larger step",
        )
    gpu_id = gpus_repo.gpu_id_by_uuid(conn, uuid=uuid)
    if gpu_id is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"uuid: no GPU {uuid}")
    resolution = gpus_repo.choose_resolution(step_seconds)
    s = ctx.settings
    now = ctx.clock()
    # Past raw (or 1m) retention only the coarser data is left, so read that.
    if resolution == "raw" and start_at < now - timedelta(days=s.retention_raw_days):
        resolution = "1m"
    if resolution == "1m" and start_at < now - timedelta(days=s.retention_1m_days):
        resolution = "1h"
    points = gpus_repo.series(
        conn,
        gpu_id=gpu_id,
        metric=metric,
        start=start_at,
        end=end_at,
        step_seconds=step_seconds,
        resolution=resolution,
    )
    body = SeriesPublic.model_validate(
        {
            "gpu_uuid": uuid,
            "metric": metric,
            "unit": unit,
            "start": start_at,
            "end": end_at,
            "step_seconds": step_seconds,
            "resolution": resolution,
            "points": [
                {"ts": p.ts, "avg": p.avg, "min": p.min, "max": p.max, "count": p.sample_count}
                for p in points
            ],
        }
    )
    # Serialise once here; letting FastAPI re-validate thousands of points doubles the cost.
    return Response(body.model_dump_json(), media_type="application/json")
