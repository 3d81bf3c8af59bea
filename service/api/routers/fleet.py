"""``/api/v1/fleet``: every GPU now with the dollars it wasted today, in one read (the console's
first page)."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request, Response

from service.api import query
from service.api.deps import Ctx, Expensive, ReadConn, Reader
from service.api.schemas.gpus import FleetPublic
from service.errors import ValidationFailed
from service.usecases.fleet import FleetFilter, WastedTodayCache, fleet_now

router = APIRouter(prefix="/fleet", tags=["gpus"])


@router.get("", response_model=FleetPublic, dependencies=[Expensive])
def fleet(
    request: Request,
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
        "no-data, unclassified",
    ),
    cause: str | None = Query(
        None, description="only GPUs whose latest sample has this cause (e.g. transfer_bound)"
    ),
) -> Response:
    """Every GPU as ``GET /gpus`` shows it, with ``wasted_today_usd`` since midnight UTC (the
    dollars at most one rollup interval old); with filters only the GPUs they let through, and
    the total of those. An unknown node, model, team, state or cause is a 422 naming the nearest."""
    cache: WastedTodayCache | None = getattr(request.app.state, "fleet_cache", None)
    only = FleetFilter(node=node, model=model, team=team, state=state, cause=cause)
    try:
        data = fleet_now(conn, settings=ctx.settings, now=ctx.clock(), cache=cache, only=only)
    except ValidationFailed as exc:
        raise query.query_error(exc.field, exc.message) from None
    body = FleetPublic.model_validate(data)
    # Serialise once here; letting FastAPI validate a thousand GPUs again doubles the cost.
    return Response(body.model_dump_json(), media_type="application/json")
