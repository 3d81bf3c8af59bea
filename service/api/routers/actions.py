"""``/api/v1/actions``: the ladders' audit log, every step newest first (JSON, CSV)."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from typing import Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request, Response

from service.api import query
from service.api.deps import Ctx, ReadConn, Scope, one_job_in_scope
from service.api.params import MAX_ROW_ID
from service.api.routers.reports import csv_cell
from service.api.schemas.actions import ActionPublic
from service.core.querytime import EARLIEST, LATEST
from service.db.actions_repo import MAX_ACTIONS_LISTED, list_actions
from service.vocabulary import ACTION_OUTCOMES

router = APIRouter(prefix="/actions", tags=["actions"])

# The response model's fields, in its order.
CSV_COLUMNS: tuple[str, ...] = tuple(ActionPublic.model_fields)


def to_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """The audit log's rows as CSV, one line per step; an empty cell is null."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")  # RFC 4180, as the cost report
    w.writerow(CSV_COLUMNS)
    for row in rows:
        cells = {k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in row.items()}
        w.writerow([csv_cell(cells.get(c)) for c in CSV_COLUMNS])
    return buf.getvalue()


def next_link(request: Request, rows: Sequence[Mapping[str, Any]], limit: int) -> str | None:
    """The ``Link`` header to the next, older page when this one is full; None otherwise."""
    if len(rows) < limit:
        return None
    params = [(k, v) for k, v in request.query_params.multi_items() if k != "before"]
    params.append(("before", str(rows[-1]["id"])))
    return f'<{request.url.path}?{urlencode(params)}>; rel="next"'


@router.get("", response_model=list[ActionPublic])
def get_actions(
    request: Request,
    response: Response,
    ctx: Ctx,
    conn: ReadConn,
    scope: Scope,
    job: str | None = Query(None, description="only this job's steps (slurm:4242)"),
    user: str | None = Query(None, description="only steps on this user's jobs"),
    team: str | None = Query(None, description="only steps on this team's jobs"),
    policy: str | None = Query(None, description="only this policy's ladder"),
    outcome: str | None = Query(
        None,
        description=f"only steps with this outcome: {', '.join(ACTION_OUTCOMES)}",
        json_schema_extra={"enum": list(ACTION_OUTCOMES)},
    ),
    start: str | None = Query(None, description=f"{query.TIME_HELP}; default: the first step"),
    end: str | None = Query(None, description=f"{query.TIME_HELP}; default now"),
    since: str | None = Query(None, description=query.SINCE_HELP),
    before: int | None = Query(
        None,
        ge=1,
        le=MAX_ROW_ID,
        description="the next page: the steps after this one (the id the Link header names)",
    ),
    limit: int = Query(100, ge=1, le=MAX_ACTIONS_LISTED),
    format: Literal["json", "csv"] = Query("json"),
) -> Any:
    """Ladder steps in [start, end), newest first, filtered; a full page names the next one in
    ``Link: <...&before=ID>; rel="next"``; a person lists one of their own or their teams'
    jobs' steps (``job``)."""
    one_job_in_scope(conn, scope, job)
    if outcome is not None and outcome not in ACTION_OUTCOMES:
        known = ", ".join(ACTION_OUTCOMES)
        raise query.query_error("outcome", f"{outcome!r} is not one of {known}")
    now = ctx.clock()
    # Without start or since: every step up to end (the log is small beside the samples).
    everything = (LATEST - EARLIEST).total_seconds()
    start_at, end_at = query.window(
        start=start, end=end, since=since, now=now, default_seconds=everything
    )
    rows = list_actions(
        conn,
        job_id=job,
        user=user,
        team=team,
        policy=policy,
        outcome=outcome,
        since=start_at,
        # Without an end, no bound: a step recorded this second (or by a replica whose clock is
        # a little ahead) is listed.
        until=end_at if end is not None else None,
        before_id=before,
        limit=limit,
    )
    link = next_link(request, rows, limit)
    if format == "csv":
        headers = {"Content-Disposition": 'attachment; filename="gpuwarden-actions.csv"'}
        if link:
            headers["Link"] = link
        return Response(to_csv(rows), media_type="text/csv; charset=utf-8", headers=headers)
    if link:
        response.headers["Link"] = link
    return rows
