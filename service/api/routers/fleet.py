"""``/api/v1/fleet``: every GPU now with the dollars it wasted today, in one read (the console's
first page)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from service.api.deps import Ctx, Expensive, ReadConn, Reader
from service.api.schemas.gpus import FleetPublic
from service.usecases.fleet import WastedTodayCache, fleet_now

router = APIRouter(prefix="/fleet", tags=["gpus"])


@router.get("", response_model=FleetPublic, dependencies=[Expensive])
def fleet(request: Request, ctx: Ctx, conn: ReadConn, _: Reader) -> Response:
    """Every GPU as ``GET /gpus`` shows it, with ``wasted_today_usd`` since midnight UTC (the
    dollars at most one rollup interval old)."""
    cache: WastedTodayCache | None = getattr(request.app.state, "fleet_cache", None)
    data = fleet_now(conn, settings=ctx.settings, now=ctx.clock(), cache=cache)
    body = FleetPublic.model_validate(data)
    # Serialise once here; letting FastAPI validate a thousand GPUs again doubles the cost.
    return Response(body.model_dump_json(), media_type="application/json")
