"""Request and response models of policies, channels, silences and alerts."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field

from service.api.schemas.derive import mirror
from service.api.schemas.times import StoredTimeAnyZone
from service.db.rows import AlertEvent, AlertRow, SilenceRow
from service.thresholds.ladder import LadderSpec
from service.thresholds.policy import MATCH_LABELS, ChannelSpec


class PolicyPublic(BaseModel):
    """A policy as stored, with where it came from (the YAML file or the API)."""

    name: str
    metric: str
    aggregate: str
    window: str
    op: str
    threshold: float
    for_: str = Field(serialization_alias="for")
    scope: str
    match: dict[str, str]
    severity: str
    channels: list[str]
    repeat_interval: str
    send_resolved: bool
    description: str | None
    ladder: LadderSpec | None = None


class ChannelPublic(BaseModel):
    """A channel without its secret; Slack URLs (secrets themselves) show only their host."""

    name: str
    type: str
    url: str
    has_secret: bool
    rate_limit_per_second: float
    to: list[str] = Field(default_factory=list)  # email and slack_dm: fixed recipients

    @classmethod
    def of(cls, c: ChannelSpec) -> ChannelPublic:
        """The public view of ``c``."""
        url = ""
        if c.is_http:
            parts = urlsplit(c.url)
            url = f"{parts.scheme}://{parts.netloc}"
            url += "/…" if c.type == "slack" or parts.query else parts.path
        return cls(
            name=c.name,
            type=c.type,
            url=url,
            has_secret=c.secret is not None,
            rate_limit_per_second=c.messages_per_second,
            to=c.to,
        )


class ChannelTestResult(BaseModel):
    """The outcome of ``POST /channels/{name}/test``."""

    delivered: bool
    delivery_id: str
    error: str | None = None


class SilenceCreate(BaseModel):
    """A silence: alerts whose labels match every matcher (shell patterns) are not notified."""

    matchers: dict[str, str] = Field(
        min_length=1,
        description=f"label -> pattern; labels: policy, severity, {', '.join(MATCH_LABELS)}",
    )
    starts_at: StoredTimeAnyZone | None = None
    ends_at: StoredTimeAnyZone
    comment: str = Field(min_length=1)
    created_by: str | None = None


@mirror(SilenceRow)
class SilencePublic(BaseModel):
    """A stored silence and whether it is in force now."""

    status: Literal["pending", "active", "expired"]


@mirror(AlertEvent)
class AlertEventPublic(BaseModel):
    """One state change of an alert."""


@mirror(AlertRow, exclude=("last_resent_at", "job_id", "node", "gpu_uuid"))
class AlertPublic(BaseModel):
    """An alert episode with its history; silenced and suppressed alerts are shown, flagged."""

    history: list[AlertEventPublic]
