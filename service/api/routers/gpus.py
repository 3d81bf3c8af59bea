"""``/api/v1/gpus``: the fleet and each GPU's series."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, NamedTuple, TypedDict

from fastapi import APIRouter, HTTPException, Query, Response, status
from sqlalchemy import Connection

from service.api import query
from service.api.deps import Ctx, Expensive, ReadConn, Reader, Scope, gpus_in_scope, visible_job
from service.api.schemas.gpus import (
    GpuMovePublic,
    GpuPublic,
    SeriesBatchPublic,
    SeriesPublic,
)
from service.context import ServiceContext
from service.db import gpus_repo, jobs_repo
from service.db.rows import GpuMove, GpuRow, JobRow
from service.usecases.fleet import with_states
from service.vocabulary import METRICS_BY_NAME

router = APIRouter(prefix="/gpus", tags=["gpus"])

MAX_POINTS = 11_000  # like Prometheus: refuse queries that would return more points


@router.get("", response_model=list[GpuPublic])
def list_gpus(
    ctx: Ctx, conn: ReadConn, _: Reader, node: str | None = None, model: str | None = None
) -> list[GpuRow]:
    """Every GPU with its node, model, last-seen time, latest values and state now."""
    now = ctx.clock()
    every = gpus_repo.list_gpus(
        conn,
        now=now,
        start_skew_seconds=ctx.settings.ingest_max_future_seconds,
        node=node,
        model=model,
    )
    return with_states(conn, every, now=now, settings=ctx.settings)


@router.get("/{uuid}/moves", response_model=list[GpuMovePublic])
def gpu_moves(uuid: str, conn: ReadConn, _: Reader) -> list[GpuMove]:
    """The GPU's history of nodes: each move to a node that reported it, oldest first."""
    gpu_id = gpus_repo.gpu_id_by_uuid(conn, uuid=uuid)
    if gpu_id is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no GPU with uuid {uuid!r}")
    return gpus_repo.moves(conn, gpu_id=gpu_id)


_METRIC_HELP = (
    "a canonical metric name, e.g. sm_active, or activity (the ladder: "
    "sm_active, else gr_engine_active, else gpu_util)"
)
_STEP_HELP = "per point: 10s, 5m or seconds; default about 300 points"
MAX_BATCH_SERIES = 128  # 16 GPUs of a job times 8 metrics
MAX_BATCH_POINTS = 200_000  # about 10 MB of JSON


def _units() -> dict[str, str]:
    return {name: spec.unit for name, spec in METRICS_BY_NAME.items()} | {"activity": "ratio"}


def _check_metrics(metrics: list[str]) -> dict[str, str]:
    """Each metric's unit; a 422 naming ``metric`` for one that is not known."""
    units = _units()
    for metric in metrics:
        if metric not in units:
            raise query.query_error(
                "metric", f"unknown metric {metric!r}; known: {', '.join(units)}"
            )
    return {m: units[m] for m in metrics}


class _Plan(NamedTuple):
    start: datetime
    end: datetime
    step_seconds: float
    resolution: gpus_repo.Resolution


def _plan(
    ctx: ServiceContext, *, start_at: datetime, end_at: datetime, step: str | None, lines: int
) -> _Plan:
    """The step and stored resolution of ``lines`` series over [start_at, end_at); a 422
    naming ``step`` when that is more points than one answer may hold."""
    span = (end_at - start_at).total_seconds()
    step_seconds = query.seconds("step", step) or max(span / 300, 1.0)
    per_line = span / step_seconds
    if per_line > MAX_POINTS:
        raise query.query_error(
            "step",
            f"{per_line:.0f} points requested; at most {MAX_POINTS}, so use a larger step",
        )
    if per_line * lines > MAX_BATCH_POINTS:
        raise query.query_error(
            "step",
            f"{per_line * lines:.0f} points requested ({lines} series); at most "
            f"{MAX_BATCH_POINTS}, so use a larger step or fewer metrics",
        )
    resolution = gpus_repo.choose_resolution(step_seconds)
    s = ctx.settings
    now = ctx.clock()
    # Past raw (or 1m) retention only the coarser data is left, so read that.
    if resolution == "raw" and start_at < now - timedelta(days=s.retention_raw_days):
        resolution = "1m"
    if resolution == "1m" and start_at < now - timedelta(days=s.retention_1m_days):
        resolution = "1h"
    return _Plan(start_at, end_at, step_seconds, resolution)


class _Point(TypedDict):
    """One step of a series as SeriesPointPublic validates it (a dict: thousands are cheap)."""

    ts: datetime
    avg: float
    min: float
    max: float
    count: int


def _points(points: list[gpus_repo.SeriesPoint]) -> list[_Point]:
    return [
        {"ts": p.ts, "avg": p.avg, "min": p.min, "max": p.max, "count": p.sample_count}
        for p in points
    ]


@router.get("/{uuid}/series", response_model=SeriesPublic, dependencies=[Expensive])
def gpu_series(
    uuid: str,
    ctx: Ctx,
    conn: ReadConn,
    scope: Scope,
    metric: str = Query(description=_METRIC_HELP),
    start: str | None = Query(None, description=f"{query.TIME_HELP}; default end - 1h"),
    end: str | None = Query(None, description=f"{query.TIME_HELP}; default now"),
    since: str | None = Query(None, description=query.SINCE_HELP),
    step: str | None = Query(None, description=_STEP_HELP),
) -> Response:
    """One metric of one GPU over [start, end), read from raw, 1m or 1h data as step allows (a
    person: of a GPU a job in their scope held)."""
    gpus_in_scope(conn, scope, [uuid])
    unit = _check_metrics([metric])[metric]
    start_at, end_at = query.window(
        start=start, end=end, since=since, now=ctx.clock(), default_seconds=3600
    )
    plan = _plan(ctx, start_at=start_at, end_at=end_at, step=step, lines=1)
    gpu_id = gpus_repo.gpu_id_by_uuid(conn, uuid=uuid)
    if gpu_id is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"uuid: no GPU {uuid}")
    points = gpus_repo.series(
        conn,
        gpu_id=gpu_id,
        metric=metric,
        start=plan.start,
        end=plan.end,
        step_seconds=plan.step_seconds,
        resolution=plan.resolution,
    )
    body = SeriesPublic.model_validate(
        {
            "gpu_uuid": uuid,
            "metric": metric,
            "unit": unit,
            "start": plan.start,
            "end": plan.end,
            "step_seconds": plan.step_seconds,
            "resolution": plan.resolution,
            "points": _points(points),
        }
    )
    # Serialise once here; letting FastAPI re-validate thousands of points doubles the cost.
    return Response(body.model_dump_json(), media_type="application/json")


def _batch_gpus(
    conn: Connection, *, job: str | None, gpu: list[str]
) -> tuple[JobRow | None, list[tuple[str, str | None, int]]]:
    """The job named (or None) and the GPUs to read: (uuid, node, internal id), a job's in
    the order it got them; 404 for an unknown job or GPU, 422 when neither or both are named."""
    if job is None and not gpu:
        raise query.query_error("job", "name a job (job=) or one or more GPUs (gpu=)")
    if job is not None and gpu:
        raise query.query_error("gpu", "name either a job or GPUs, not both")
    if job is None:
        found: list[tuple[str, str | None, int]] = []
        for uuid in dict.fromkeys(gpu):
            gpu_id = gpus_repo.gpu_id_by_uuid(conn, uuid=uuid)
            if gpu_id is None:
                raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"gpu: no GPU {uuid}")
            found.append((uuid, None, gpu_id))
        return None, found
    row = jobs_repo.get_job(conn, job_id=job)
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"job {job!r} does not exist")
    seen: dict[str, tuple[str, str | None, int]] = {}
    for interval in row["intervals"]:
        uuid = interval["gpu_uuid"]
        seen.setdefault(uuid, (uuid, interval["node"], interval["gpu_id"]))
    return row, list(seen.values())


@router.get("/series", response_model=SeriesBatchPublic, dependencies=[Expensive])
def batch_series(
    ctx: Ctx,
    conn: ReadConn,
    scope: Scope,
    metric: list[str] = Query(description=f"one or more (repeat it): {_METRIC_HELP}"),
    job: str | None = Query(None, description="a job id: the series of each of its GPUs"),
    gpu: list[str] | None = Query(None, description="GPU uuids (repeat it), instead of a job"),
    start: str | None = Query(
        None, description=f"{query.TIME_HELP}; default the job's start, else end - 1h"
    ),
    end: str | None = Query(
        None, description=f"{query.TIME_HELP}; default the job's end (now while it runs), else now"
    ),
    step: str | None = Query(None, description=_STEP_HELP),
) -> Response:
    """Several metrics of a job's GPUs (or of the GPUs named) over one window, in one read:
    a job page's every chart without one request per GPU and metric (a person: of a job in
    their scope, or of GPUs such a job held)."""
    units = _check_metrics(list(dict.fromkeys(metric)))
    if job is not None:
        visible_job(scope, jobs_repo.get_job(conn, job_id=job), job)
    gpus_in_scope(conn, scope, list(dict.fromkeys(gpu or [])))
    row, found = _batch_gpus(conn, job=job, gpu=gpu or [])
    now = ctx.clock()
    if row is not None and start is None and end is None:
        start_at, end_at = row["started_at"], row["ended_at"] or now
    else:
        start_at, end_at = query.window(
            start=start, end=end, since=None, now=now, default_seconds=3600
        )
    lines = len(found) * len(units)
    if lines > MAX_BATCH_SERIES:
        raise query.query_error(
            "metric", f"{lines} series requested; at most {MAX_BATCH_SERIES} in one read"
        )
    plan = _plan(ctx, start_at=start_at, end_at=end_at, step=step, lines=lines)
    series: list[dict[str, Any]] = []
    for uuid, node, gpu_id in found:
        read = gpus_repo.series_many(
            conn,
            gpu_id=gpu_id,
            metrics=list(units),
            start=plan.start,
            end=plan.end,
            step_seconds=plan.step_seconds,
            resolution=plan.resolution,
        )
        series.extend(
            {"gpu_uuid": uuid, "node": node, "metric": m, "unit": units[m], "points": _points(p)}
            for m, p in read.items()
        )
    body = SeriesBatchPublic.model_validate(
        {
            "job": job,
            "start": plan.start,
            "end": plan.end,
            "step_seconds": plan.step_seconds,
            "resolution": plan.resolution,
            "series": series,
        }
    )
    return Response(body.model_dump_json(), media_type="application/json")
