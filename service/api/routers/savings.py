"""``/api/v1/reports/savings``: realised savings per team, user or project and month, the
promises beside them, and the calibration per cause (issue 46)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query

from service.api import query
from service.api.deps import Ctx, Expensive, ReadConn, Scope
from service.api.schemas.savings import SavingsLedgerPublic
from service.usecases import savings as savings_usecase

router = APIRouter(prefix="/reports", tags=["reports"])


@router.get("/savings", response_model=SavingsLedgerPublic, dependencies=[Expensive])
def savings_ledger(
    ctx: Ctx,
    conn: ReadConn,
    scope: Scope,
    start: str | None = Query(None, description=f"{query.TIME_HELP}; default end - 30d"),
    end: str | None = Query(None, description=f"{query.TIME_HELP}; default now"),
    since: str | None = Query(None, description=query.SINCE_HELP),
    group_by: Literal["team", "user", "project"] = Query(
        "team", description="the ledger's groups: team, user or project of the later runs"
    ),
) -> Any:
    """Realised savings (USD, to the cent) of the runs that ended in [start, end) against the
    earlier run of their work that was told a fix, per group and month, with the promised
    figure of the same fixes, every pair, and the calibration per cause; a person sees only
    their own and their teams' jobs."""
    now = ctx.clock()
    start_at, end_at = query.window(
        start=start, end=end, since=since, now=now, default_seconds=30 * 86400
    )
    found = query.query_errors(savings_usecase.savings_ledger)(
        conn, settings=ctx.settings, start=start_at, end=end_at, now=now,
        group_by=group_by, scope=scope,
    )  # fmt: skip
    return found.as_dict()
