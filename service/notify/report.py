"""Sending a periodic report, rendered once when it was queued, to a channel of any type."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import httpx
from pydantic import BaseModel

from service.clock import utc_now
from service.errors import ValidationFailed
from service.notify.base import dumps, iso, post_json
from service.notify.headers import header_value
from service.notify.webhook import signature_headers
from service.thresholds.policy import ChannelSpec


class ReportMessage(BaseModel):
    """One periodic report to one channel, as queued in the outbox: its forms and figures."""

    delivery_id: str
    kind: Literal["report"]
    recipient: str  # "user:<name>", "team:<name>" or "admins"
    period: str  # weekly, daily or a custom length
    period_start: datetime
    period_end: datetime
    subject: str
    text: str
    html: str
    slack: dict[str, Any]
    figures: dict[str, Any]
    page_url: str


def webhook_body(msg: ReportMessage) -> dict[str, Any]:
    """The webhook body, a Standard Webhooks payload of type ``report.<period>``."""
    return {
        "type": f"report.{msg.period}",
        "timestamp": iso(msg.period_end),
        "data": {
            "delivery_id": msg.delivery_id,
            "recipient": msg.recipient,
            "period_start": iso(msg.period_start),
            "period_end": iso(msg.period_end),
            "subject": msg.subject,
            "text": msg.text,
            "figures": msg.figures,
            "page_url": msg.page_url,
        },
    }


def send_report(channel: ChannelSpec, client: httpx.Client, msg: ReportMessage) -> None:
    """Send ``msg`` to ``channel``; DeliveryError on a refused attempt, ValidationFailed when
    the channel's type cannot carry a report (an Alertmanager takes alerts only)."""
    what = f"{channel.type} channel {channel.name}"
    if channel.type == "slack":
        post_json(client, channel.url, content=dumps(msg.slack), what=what)
        return
    if channel.type == "webhook":
        body = dumps(webhook_body(msg))
        headers = {"webhook-id": header_value("webhook-id", msg.delivery_id)}
        if channel.secret:
            headers = signature_headers(channel.secret, msg.delivery_id, utc_now(), body)
        post_json(client, channel.url, content=body, headers=headers, what=what)
        return
    raise ValidationFailed("channel", f"{what} takes alerts, not reports")
