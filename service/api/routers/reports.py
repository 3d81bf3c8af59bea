"""``/api/v1/reports/cost``: what GPUs cost and how much of that was idle or unused (JSON, CSV)."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response

from service.api.deps import Ctx, ReadConn, Reader
from service.api.params import TimeParam
from service.api.routers.jobs import query_error
from service.api.schemas.costs import CostReportPublic
from service.costs.waste import TAGS
from service.errors import ValidationFailed
from service.usecases import cost_report as cost_usecase

router = APIRouter(prefix="/reports", tags=["reports"])

CSV_COLUMNS = (
    "key",
    "user",
    "team",
    "project",
    "tags",
    "gpus",
    "jobs",
    "held_seconds",
    "allocated_seconds",
    "nodata_seconds",
    "idle_seconds",
    "idle_held_seconds",
    "unused_seconds",
    "fallback_seconds",
    "energy_used_joules",
    "efficiency",
    "cost_usd",
    "idle_cost_usd",
    "unused_cost_usd",
    "unpriced_seconds",
)


def to_csv(data: dict[str, Any]) -> str:
    """The report as CSV: one line per group, then a ``__total__`` line; empty cell = null."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    # Job metadata columns only make sense when each row is a job.
    columns = CSV_COLUMNS if data["group_by"] == "job" else CSV_COLUMNS[:1] + CSV_COLUMNS[5:]
    w.writerow([data["group_by"], *columns[1:]])
    for row in [*data["rows"], data["totals"]]:
        cells = []
        for c in columns:
            v = row.get(c)
            cells.append(";".join(v) if isinstance(v, list) else "" if v is None else v)
        w.writerow(cells)
    return buf.getvalue()


@router.get("/cost", response_model=CostReportPublic)
def cost_report(
    ctx: Ctx,
    conn: ReadConn,
    _: Reader,
    start: Annotated[TimeParam, Query(description="RFC 3339; default end - 7d")] = None,
    end: Annotated[TimeParam, Query(description="RFC 3339; default now")] = None,
    group_by: str = Query("job", description="job, user, team, node or gpu_model"),
    format: Literal["json", "csv"] = Query("json"),
    tag: str | None = Query(None, description=f"only jobs with this tag: {', '.join(TAGS)}"),
    user: str | None = None,
    team: str | None = None,
) -> Any:
    """Cost, idle cost and wasted (unused) cost per group over [start, end), with totals."""
    now = ctx.clock()
    end = end or now
    start = start or end - timedelta(days=7)
    try:
        data = cost_usecase.cost_report(
            conn,
            settings=ctx.settings,
            start=start,
            end=end,
            now=now,
            group_by=group_by,
            tag=tag,
            user=user,
            team=team,
        )
    except ValidationFailed as exc:
        raise query_error(exc) from exc
    if format == "csv":
        headers = {"Content-Disposition": f'attachment; filename="gpuwarden-cost-{group_by}.csv"'}
        if data["warnings"]:
            headers["X-GPUWarden-Warnings"] = " | ".join(data["warnings"])
        return Response(to_csv(data), media_type="text/csv; charset=utf-8", headers=headers)
    return data
