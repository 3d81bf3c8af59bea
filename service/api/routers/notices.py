"""``/api/v1/notices``: every message queued for a person (owner notices, reports), newest first:
what, meant for whom, sent to whom and why, when, and whether it went."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query

from service.api import query
from service.api.deps import Ctx, ReadConn, ScopedReader, one_job_in_scope
from service.api.schemas.owners import NoticePublic
from service.db import notices_repo
from service.db.rows import NoticeRow
from service.roles import Role

router = APIRouter(prefix="/notices", tags=["owners"])


@router.get("", response_model=list[NoticePublic])
def list_notices(
    ctx: Ctx,
    conn: ReadConn,
    caller: ScopedReader,
    job: str | None = None,
    user: str | None = Query(None, description="notices meant for this user"),
    team: str | None = Query(None, description="notices meant for this team"),
    kind: str | None = Query(None, description="owner_notice, report, ..."),
    status: Literal["pending", "sent", "failed", "unreachable"] | None = None,
    start: str | None = Query(None, description=query.TIME_HELP),
    end: str | None = Query(None, description=query.TIME_HELP),
    limit: int = Query(200, ge=1, le=10_000),
) -> list[NoticeRow]:
    """Notices queued in [start, end), filtered; addresses are shown to admins only; a person
    lists those of one of their own or their teams' jobs (``job``), or their own or their
    teams' (``user``, ``team``)."""
    one_job_in_scope(conn, caller.scope, job, user=user, team=team)
    now = ctx.clock()
    asked = f"user:{user}" if user else (f"team:{team}" if team else None)
    rows = notices_repo.list_notices(
        conn,
        job_id=job,
        asked=asked,
        kind=kind,
        status=status,
        since=query.instant("start", start, now=now),
        until=query.instant("end", end, now=now),
        limit=limit,
    )
    if caller.role is not Role.ADMIN:
        rows = [r | {"address": None} for r in rows]
    return rows
