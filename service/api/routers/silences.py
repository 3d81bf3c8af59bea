"""``/api/v1/silences``: mute notifications of matching alerts for a while."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, status

from service.api.deps import Admin, Ctx, ReadConn, Reader, WriteConn
from service.api.params import row_id
from service.api.schemas.alerting import SilenceCreate, SilencePublic
from service.db import changes_repo, silences_repo
from service.db.rows import SilenceRow
from service.errors import ValidationFailed

router = APIRouter(prefix="/silences", tags=["alerting"])


def _public(row: SilenceRow, now: datetime) -> SilencePublic:
    state = "pending" if now < row["starts_at"] else "active" if now < row["ends_at"] else "expired"
    return SilencePublic.model_validate({**row, "status": state})


@router.get("", response_model=list[SilencePublic])
def list_silences(ctx: Ctx, conn: ReadConn, _: Reader) -> list[SilencePublic]:
    """Every silence, newest first, with its status now."""
    now = ctx.clock()
    return [_public(r, now) for r in silences_repo.list_silences(conn)]


@router.post("", response_model=SilencePublic, status_code=status.HTTP_201_CREATED)
def create_silence(body: SilenceCreate, ctx: Ctx, conn: WriteConn, token: Admin) -> SilencePublic:
    """Create a silence from ``starts_at`` (default now) to ``ends_at``."""
    now = ctx.clock()
    for field, value in (("starts_at", body.starts_at), ("ends_at", body.ends_at)):
        if value is not None and value.tzinfo is None:
            raise ValidationFailed(field, "timestamps need a timezone, e.g. 2026-12-02T08:00:00Z")
    starts = body.starts_at or now
    if body.ends_at <= starts:
        raise ValidationFailed("ends_at", "must be after starts_at")
    silence_id = silences_repo.create_silence(
        conn,
        matchers=body.matchers,
        starts_at=starts,
        ends_at=body.ends_at,
        comment=body.comment,
        # Who made it: the body may name someone, the person or token that did is kept too.
        created_by=body.created_by or token.actor,
        now=now,
    )
    changes_repo.record(conn, actor=token.actor, kind="silence", name=str(silence_id),
                        action="create", now=now)  # fmt: skip
    row = next(r for r in silences_repo.list_silences(conn) if r["id"] == silence_id)
    return _public(row, now)


@router.delete("/{silence_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_silence(silence_id: int, ctx: Ctx, conn: WriteConn, token: Admin) -> None:
    """End a silence now (it stays listed as expired)."""
    silences_repo.expire_silence(
        conn, silence_id=row_id(silence_id, what="silence"), now=ctx.clock()
    )
    changes_repo.record(conn, actor=token.actor, kind="silence", name=str(silence_id),
                        action="delete", now=ctx.clock())  # fmt: skip
