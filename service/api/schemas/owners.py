"""Request and response models of the owner directory and the record of notices sent."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from service.api.schemas.derive import mirror
from service.api.schemas.times import StoredTimeAnyZone
from service.db.owners_repo import StoredOwner
from service.db.rows import NoticeRow
from service.thresholds.owners import (
    EMAIL_MAX,
    EMAIL_PATTERN,
    OWNER_NAME_PATTERN,
    SLACK_ID_PATTERN,
)

Email = Field(None, pattern=EMAIL_PATTERN, max_length=EMAIL_MAX)
SlackId = Field(None, pattern=SLACK_ID_PATTERN)


class OwnerUpdate(BaseModel):
    """How to reach a user, team or the admins: e-mail, Slack id, the copies, a user's team."""

    model_config = ConfigDict(extra="forbid")

    email: str | None = Email
    slack: str | None = SlackId  # a Slack user id (U...) for a DM, or a channel id (C...)
    cc_email: str | None = Email  # a manager or a team list, copied on every notice
    cc_slack: str | None = SlackId  # a team channel id, copied on every notice
    # A user's team: where their notices go when they have no address.
    team: str | None = Field(None, pattern=OWNER_NAME_PATTERN)


class OwnerCreate(OwnerUpdate):
    """A new directory entry: its kind and name, and how to reach it."""

    kind: Literal["user", "team", "admins"]
    name: str = Field(pattern=OWNER_NAME_PATTERN)


class OwnerPublic(BaseModel):
    """A directory entry with where it came from (file, api or lookup, cached until
    ``expires_at``)."""

    kind: str
    name: str
    email: str | None
    slack: str | None
    cc_email: str | None
    cc_slack: str | None
    team: str | None
    source: str
    expires_at: StoredTimeAnyZone | None
    updated_at: StoredTimeAnyZone

    @classmethod
    def of(cls, s: StoredOwner) -> OwnerPublic:
        """The public view of a stored entry."""
        return cls(
            **s.entry.model_dump(),
            source=s.source,
            expires_at=s.expires_at,
            updated_at=s.updated_at,
        )


@mirror(NoticeRow, first=("id", "delivery_id"))
class NoticePublic(BaseModel):
    """A message queued for a person: what, meant for whom, sent to whom (and why, when it
    fell back to the team or the admins), on which channel, when, and whether it went.
    ``address`` is shown to admins only."""

    status: Literal["pending", "sent", "failed", "unreachable"]
    created_at: StoredTimeAnyZone
    sent_at: StoredTimeAnyZone | None


__all__ = ["NoticePublic", "OwnerCreate", "OwnerPublic", "OwnerUpdate", "datetime"]
