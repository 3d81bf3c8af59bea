"""``/api/v1/alerts``: alerts with their history, filterable by state, policy, job and node."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query

from service.api.deps import ReadConn, Reader
from service.api.params import row_id
from service.api.schemas.alerting import AlertPublic
from service.db import alert_state_repo
from service.errors import NotFound

router = APIRouter(prefix="/alerts", tags=["alerting"])


@router.get("", response_model=list[AlertPublic])
def list_alerts(
    conn: ReadConn,
    _: Reader,
    state: Literal["pending", "firing", "resolved", "inactive"] | None = None,
    policy: str | None = None,
    job: str | None = None,
    node: str | None = None,
    limit: int = Query(500, ge=1, le=10_000),
) -> list[dict[str, Any]]:
    """Alerts newest first (pending, firing and resolved unless ``state`` says otherwise)."""
    return alert_state_repo.list_alerts(
        conn, state=state, policy=policy, job=job, node=node, limit=limit
    )


@router.get("/{alert_id}", response_model=AlertPublic)
def get_alert(alert_id: int, conn: ReadConn, _: Reader) -> dict[str, Any]:
    """One alert with its history."""
    rows = alert_state_repo.list_alerts(conn, alert_id=row_id(alert_id, what="alert"))
    if not rows:
        raise NotFound(f"no alert with id {alert_id}")
    return rows[0]
