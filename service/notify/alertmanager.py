"""Alertmanager notifier: ``POST /api/v2/alerts`` with labels, annotations, startsAt and endsAt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from service.notify.base import Notification, dumps, iso, post_json
from service.thresholds.policy import ChannelSpec


def render(note: Notification) -> list[dict[str, Any]]:
    """The v2 alerts body: one alert whose labels identify it and whose endsAt says how long."""
    labels = {"alertname": note.policy, **note.alert_labels()}
    annotations = {
        "summary": note.headline(),
        "description": note.condition(),
        "scope": note.scope,
    }
    if note.description:
        annotations["policy_description"] = note.description
    for name in ("waste_usd", "idle_usd", "fixable_usd"):
        value = getattr(note.verdict, name)
        if value is not None:
            annotations[name] = f"{value:.2f}"
    if note.verdict.top_cause:
        annotations["top_cause"] = note.verdict.top_cause
    if note.report_url:
        annotations["report_url"] = note.report_url
    if muted := muted_by(note):
        annotations["gpuwarden_muted"] = muted
    alert: dict[str, Any] = {
        "labels": labels,
        "annotations": annotations,
        "startsAt": iso(note.fired_at or note.active_since),
    }
    ends = note.resolved_at if note.status == "resolved" else note.ends_at
    if ends is not None:
        alert["endsAt"] = iso(ends)
    if note.alert_url:
        alert["generatorURL"] = note.alert_url
    return [alert]


def muted_by(note: Notification) -> str:
    """What mutes ``note`` in GPU Warden ("silenced", "suppressed": by a hardware fault or a more
    specific idle alert, both comma-separated), or "" when nothing does.

    An annotation, not a label: Alertmanager knows an alert by its labels, and a new label set
    would let the one it holds expire into "resolved" while the alert still fires.
    """
    return ",".join(
        name for name, on in (("silenced", note.silenced), ("suppressed", note.suppressed)) if on
    )


@dataclass(frozen=True, slots=True)
class AlertmanagerNotifier:
    """Posts to an Alertmanager base URL (``http://am:9093``); re-sent while firing, muted
    in GPU Warden or not."""

    channel: ChannelSpec
    client: httpx.Client

    def send(self, note: Notification) -> None:
        """Post ``note`` to ``<url>/api/v2/alerts``; DeliveryError on failure."""
        post_json(
            self.client,
            self.channel.url.rstrip("/") + "/api/v2/alerts",
            content=dumps(render(note)),
            what=f"alertmanager channel {self.channel.name}",
        )
