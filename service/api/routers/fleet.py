"""``/api/v1/fleet``: every GPU now with the dollars it wasted today, in one read (the console's
first page)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from service.api.deps import Ctx, Expensive, ReadConn, Reader
from service.api.schemas.gpus import FleetPublic
from service.usecases.fleet import fleet_now

router = APIRouter(prefix="/fleet", tags=["gpus"])


@router.get("", response_model=FleetPublic, dependencies=[Expensive])
def fleet(ctx: Ctx, conn: ReadConn, _: Reader) -> Response:
    """Every GPU as ``GET /gpus`` shows it, with ``wasted_today_usd`` since midnight UTC."""
    body = FleetPublic.model_validate(fleet_now(conn, settings=ctx.settings, now=ctx.clock()))
    # Serialise once here; letting FastAPI validate a thousand GPUs again doubles the cost.
    return Response(body.model_dump_json(), media_type="application/json")
