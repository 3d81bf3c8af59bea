"""``/api/v1/alerts``: alerts with their history, filterable by state, policy, job and node."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from fastapi import APIRouter, Query
from sqlalchemy import Connection

from service.api.deps import Ctx, ReadConn, Reader, Scope, one_job_in_scope
from service.api.params import row_id
from service.api.schemas.alerting import AlertPublic
from service.db import alert_state_repo, policies_repo, silences_repo
from service.db.rows import AlertRow
from service.errors import NotFound
from service.thresholds.evaluator import silenced_now

router = APIRouter(prefix="/alerts", tags=["alerting"])


def _with_silences(conn: Connection, rows: list[AlertRow], now: datetime) -> list[AlertRow]:
    """Open alerts flagged silenced as the silences stand now, not as at the last evaluation:
    a silence made (or expired) a moment ago shows on the alerts at once."""
    if not any(r["state"] in _OPEN for r in rows):
        return rows
    silences = silences_repo.active_silences(conn, now=now)
    policies = {p.name: p for p in policies_repo.list_policies(conn)}
    for r in rows:
        if r["state"] in _OPEN:
            r["silenced"] = silenced_now(
                policies.get(r["policy"]), labels=r["labels"], silences=silences, now=now
            )
    return rows


_OPEN = ("pending", "firing")


@router.get("", response_model=list[AlertPublic])
def list_alerts(
    ctx: Ctx,
    conn: ReadConn,
    scope: Scope,
    state: Literal["pending", "firing", "resolved", "inactive"] | None = None,
    policy: str | None = None,
    job: str | None = None,
    node: str | None = None,
    limit: int = Query(500, ge=1, le=10_000),
) -> list[AlertRow]:
    """Alerts newest first (pending, firing and resolved unless ``state`` says otherwise); a
    person lists those of one of their own or their teams' jobs (``job``)."""
    one_job_in_scope(conn, scope, job)
    rows = alert_state_repo.list_alerts(
        conn, state=state, policy=policy, job=job, node=node, limit=limit
    )
    return _with_silences(conn, rows, ctx.clock())


@router.get("/{alert_id}", response_model=AlertPublic)
def get_alert(alert_id: int, ctx: Ctx, conn: ReadConn, _: Reader) -> AlertRow:
    """One alert with its history."""
    rows = alert_state_repo.list_alerts(conn, alert_id=row_id(alert_id, what="alert"))
    if not rows:
        raise NotFound(f"no alert with id {alert_id}")
    return _with_silences(conn, rows, ctx.clock())[0]
