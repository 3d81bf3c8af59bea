"""``/api/v1/fleet``: every GPU now with its dollars of today, counted and summed in one read,
a page of them in full (the console's first page)."""

from __future__ import annotations

from fastapi import APIRouter, Query, Response

from service.api import query
from service.api.deps import AppState, Ctx, Expensive, ReadConn, Reader
from service.api.schemas.gpus import FleetPublic
from service.costs.money import SORT_BYS
from service.usecases.fleet import FleetFilter, FleetPage, fleet_now

router = APIRouter(prefix="/fleet", tags=["gpus"])


@router.get("", response_model=FleetPublic, dependencies=[Expensive])
def fleet(
    app_state: AppState,
    ctx: Ctx,
    conn: ReadConn,
    _: Reader,
    node: str | None = Query(None, description="only the GPUs of this node"),
    model: str | None = Query(None, description="only the GPUs of this model"),
    team: str | None = Query(
        None, description="only GPUs this team's jobs held today or hold now, with its dollars"
    ),
    state: str | None = Query(
        None,
        description="only GPUs in this state: working, underused, idle-held, idle, lost, "
        "no-data, unclassified, sham, hung",
    ),
    cause: str | None = Query(
        None, description="only GPUs whose latest sample has this cause (e.g. transfer_bound)"
    ),
    user: str | None = Query(None, description="only GPUs this user's jobs hold now"),
    sort: str = Query("waste", description=f"largest first by one of {', '.join(SORT_BYS)}"),
    limit: int | None = Query(
        None,
        ge=1,
        description="at most this many GPUs in full (all without); counts and "
        "totals cover every GPU the filters let through",
    ),
    offset: int = Query(0, ge=0, description="skip this many GPUs of the sorted view first"),
) -> Response:
    """Every GPU as ``GET /gpus`` shows it, with its cost, waste (idle + fixable) and lost USD
    since midnight UTC (the dollars at most one rollup interval old, or up to where today's
    sums end: ``dollars_until``), largest waste first (or
    ``sort``); with filters only the GPUs they let through, and the counts and totals of
    those; with ``limit`` only a page of them in full. An unknown node, model, team, state or
    cause is a 422 naming the nearest."""
    if sort not in SORT_BYS:
        raise query.query_error("sort", f"unknown sort {sort!r}; one of {SORT_BYS}")
    cache = app_state.fleet_cache
    only = FleetFilter(node=node, model=model, team=team, user=user, state=state, cause=cause)
    data = query.query_errors(fleet_now)(
        conn, settings=ctx.settings, now=ctx.clock(), cache=cache, only=only, sort_by=sort,
        page=FleetPage(offset=offset, limit=limit),
    )  # fmt: skip
    body = FleetPublic.model_validate(data)
    # Serialise once here; letting FastAPI validate a thousand GPUs again doubles the cost.
    return Response(body.model_dump_json(), media_type="application/json")
