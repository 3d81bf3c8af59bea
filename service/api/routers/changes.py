"""``/api/v1/changes``: who changed which policy, ladder, channel, silence, price table or owner
entry, and when (a person signed in through single sign-on, or a token)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel

from service.api.deps import ReadConn, Reader
from service.api.schemas.derive import mirror
from service.db import changes_repo

router = APIRouter(prefix="/changes", tags=["alerting"])


@mirror(changes_repo.ConfigChange)
class ChangePublic(BaseModel):
    """One configuration change: who made it (``person:alice`` or ``token:<name or prefix>``)."""


@router.get("", response_model=list[ChangePublic])
def list_changes(
    conn: ReadConn,
    _: Reader,
    kind: Literal["policy", "ladder", "channel", "silence", "prices", "owner", "sessions"]
    | None = None,
    actor: str | None = Query(None, max_length=300, description="person:alice or token:<name>"),
    limit: int = Query(500, ge=1, le=10_000),
) -> list[changes_repo.ConfigChange]:
    """Configuration changes newest first, of ``kind`` and by ``actor`` where given."""
    return changes_repo.list_changes(conn, kind=kind, actor=actor, limit=limit)
