"""``/api/v1/gpus``: the fleet and each GPU's series."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response, status

from service.api.deps import Ctx, ReadConn, Reader
from service.api.params import TimeParam
from service.api.schemas.gpus import GpuPublic, SeriesPublic
from service.db import gpus_repo
from service.durations import parse_duration_param
from service.vocabulary import METRICS_BY_NAME

router = APIRouter(prefix="/gpus", tags=["gpus"])

MAX_POINTS = 11_000  # like Prometheus: refuse queries that would return more points


@router.get("", response_model=list[GpuPublic])
def list_gpus(
    conn: ReadConn, _: Reader, node: str | None = None, model: str | None = None
) -> list[dict[str, object]]:
    """Every GPU with its node, model, last-seen time and latest values."""
    return gpus_repo.list_gpus(conn, node=node, model=model)


@router.get("/{uuid}/series", response_model=SeriesPublic)
def gpu_series(
    uuid: str,
    ctx: Ctx,
    conn: ReadConn,
    _: Reader,
    metric: str = Query(description="a canonical metric name, e.g. sm_active"),
    start: Annotated[TimeParam, Query(description="RFC 3339; default end - 1h")] = None,
    end: Annotated[TimeParam, Query(description="RFC 3339; default now")] = None,
    step: str | None = Query(
        None,
        description="per point: seconds (30, 2.5) or a duration (30s, 5m); default ~300 points",
    ),
) -> Response:
    """One metric of one GPU over [start, end), read from raw, 1m or 1h data as step allows."""
    spec = METRICS_BY_NAME.get(metric)
    if spec is None:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            detail=f"metric: unknown metric {metric!r}; known: {', '.join(METRICS_BY_NAME)}",
        )
    end = end or ctx.clock()
    start = start or end - timedelta(hours=1)
    if start >= end:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT, detail="start: must be before end"
        )
    span = (end - start).total_seconds()
    step_s = max(span / 300, 1.0)
    if step is not None:
        try:
            step_s = parse_duration_param(step)
        except ValueError as exc:
            raise HTTPException(
                status.HTTP_422_UNPROCESSABLE_CONTENT, detail=f"step: {exc}"
            ) from None
        if step_s <= 0:
            raise HTTPException(
                status.HTTP_422_UNPROCESSABLE_CONTENT, detail="step: must be greater than 0"
            )
    if span / step_s > MAX_POINTS:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            detail=f"step: {span / step_s:.0f} points requested; at most {MAX_POINTS}, "
            "so use a larger step",
        )
    gpu_id = gpus_repo.gpu_id_by_uuid(conn, uuid=uuid)
    if gpu_id is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"uuid: no GPU {uuid}")
    resolution = gpus_repo.choose_resolution(step_s)
    s = ctx.settings
    now = ctx.clock()
    # Past raw (or 1m) retention only the coarser data is left, so read that.
    if resolution == "raw" and start < now - timedelta(days=s.retention_raw_days):
        resolution = "1m"
    if resolution == "1m" and start < now - timedelta(days=s.retention_1m_days):
        resolution = "1h"
    points = gpus_repo.series(
        conn,
        gpu_id=gpu_id,
        metric=metric,
        start=start,
        end=end,
        step_seconds=step_s,
        resolution=resolution,
    )
    body = SeriesPublic.model_validate(
        {
            "gpu_uuid": uuid,
            "metric": metric,
            "unit": spec.unit,
            "start": start,
            "end": end,
            "step_seconds": step_s,
            "resolution": resolution,
            "points": [
                {"ts": p.ts, "avg": p.avg, "min": p.min, "max": p.max, "count": p.sample_count}
                for p in points
            ],
        }
    )
    # Serialise once here; letting FastAPI re-validate thousands of points doubles the cost.
    return Response(body.model_dump_json(), media_type="application/json")
