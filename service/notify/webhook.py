"""Generic webhook notifier: JSON signed as Standard Webhooks (webhook-id/-timestamp/-signature)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
from standardwebhooks.webhooks import Webhook

from service.clock import Clock, utc_now
from service.notify.base import Notification, dumps, iso, post_json
from service.notify.headers import header_value
from service.thresholds.policy import ChannelSpec


def render(note: Notification) -> dict[str, Any]:
    """The webhook body, a Standard Webhooks payload: ``type`` (alert.firing, alert.resolved,
    alert.test), ``timestamp`` (ISO 8601, when the alert fired or resolved) and ``data`` (the
    policy, the state, the scope's labels and the rest)."""
    happened = note.resolved_at if note.status == "resolved" else note.fired_at
    kinds = {"test": "alert.test", "notice": "ladder.notice"}
    return {
        "type": kinds.get(note.kind, f"alert.{note.status}"),
        "timestamp": iso(happened or note.active_since),
        "data": _data(note) | _notice(note),
    }


def _notice(note: Notification) -> dict[str, Any]:
    """A ladder notice's own fields (none for an alert)."""
    if note.kind != "notice":
        return {}
    return {
        "notice": note.notice,
        "next_step": note.next_step,
        "next_step_at": iso(note.next_step_at),
    }


def _data(note: Notification) -> dict[str, Any]:
    """The alert itself, the ``data`` of the webhook body."""
    return {
        "delivery_id": note.delivery_id,
        "policy": note.policy,
        "state": note.status,
        "kind": note.kind,
        "severity": note.severity,
        "scope": note.scope,
        "scope_key": note.scope_key,
        "labels": note.alert_labels(),
        "metric": note.metric,
        "aggregate": note.aggregate,
        "window": note.window,
        "op": note.op,
        "threshold": note.threshold,
        "value": note.value,
        "stale": note.stale,
        "active_since": iso(note.active_since),
        "fired_at": iso(note.fired_at),
        "resolved_at": iso(note.resolved_at),
        "waste_usd": note.verdict.waste_usd,
        "idle_usd": note.verdict.idle_usd,
        "fixable_usd": note.verdict.fixable_usd,
        "top_cause": note.verdict.top_cause,
        "fix": note.verdict.fix,
        "fix_saving_usd": note.verdict.fix_saving_usd,
        "xid_code": note.xid_code,
        "report_url": note.report_url,
        "alert_url": note.alert_url,
        "summary": note.notice
        or "; ".join(
            part
            for part in (
                f"{note.headline()}: {note.condition()}",
                note.verdict.waste_words(),
                note.verdict.cause_words(),
            )
            if part
        ),
    }


def signature_headers(secret: str, msg_id: str, when: datetime, body: bytes) -> dict[str, str]:
    """Standard Webhooks headers: HMAC-SHA256 over ``id.timestamp.body`` with ``secret``."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(when.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, when.astimezone(UTC), body.decode()),
    }


@dataclass(frozen=True, slots=True)
class WebhookNotifier:
    """Posts signed JSON; the delivery id is the webhook-id, so a retry is recognisable."""

    channel: ChannelSpec
    client: httpx.Client
    clock: Clock = utc_now

    def send(self, note: Notification) -> None:
        """Post ``note``, signed when the channel has a secret; DeliveryError on failure."""
        body = dumps(render(note))
        headers = {"webhook-id": header_value("webhook-id", note.delivery_id)}
        if self.channel.secret:
            headers = signature_headers(self.channel.secret, note.delivery_id, self.clock(), body)
        post_json(
            self.client,
            self.channel.url,
            content=body,
            headers=headers,
            what=f"webhook channel {self.channel.name}",
        )
