"""Request and response models of policies, channels, silences and alerts."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field

from service.api.schemas.times import StoredTimeAnyZone
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


class SilencePublic(BaseModel):
    """A stored silence and whether it is in force now."""

    id: int
    matchers: dict[str, str]
    starts_at: datetime
    ends_at: datetime
    comment: str
    created_by: str | None
    created_at: datetime
    status: Literal["pending", "active", "expired"]


class AlertEventPublic(BaseModel):
    """One state change of an alert."""

    ts: datetime
    from_state: str
    to_state: str
    value: float | None


class AlertPublic(BaseModel):
    """An alert episode with its history; silenced and suppressed alerts are shown, flagged."""

    id: int
    policy: str
    scope_key: str
    severity: str
    state: str
    labels: dict[str, Any]
    value: float | None
    threshold: float
    active_since: datetime
    fired_at: datetime | None
    resolved_at: datetime | None
    last_eval_at: datetime
    last_notified_at: datetime | None
    stale: bool
    suppressed: bool
    silenced: bool
    history: list[AlertEventPublic]
