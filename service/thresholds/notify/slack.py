"""Slack incoming-webhook notifier: ``text`` plus Block Kit ``blocks`` within Slack's limits."""

from __future__ import annotations

from typing import Any

import httpx

from service.thresholds.notify.base import Notification, dumps, iso, post_json
from service.thresholds.policy import ChannelSpec

# Slack's documented limits: header text 150 chars, section text 3000, at most 10 fields of
# 2000 chars each, 50 blocks; top-level text is truncated past 40,000 (we keep it short).
HEADER_MAX = 150
SECTION_MAX = 3000
FIELD_MAX = 2000
FIELDS_MAX = 10
TEXT_MAX = 3000

_WHERE_LABELS = ("node", "gpu", "job", "user", "team", "model")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render(note: Notification) -> dict[str, Any]:
    """The Slack message: what, where, since when, value vs threshold, dollars so far, link."""
    icon = {"firing": ":rotating_light:", "resolved": ":white_check_mark:"}[note.status]
    since = iso(note.fired_at or note.active_since)
    lines = [note.condition(), f"since {since}"]
    if note.status == "resolved" and note.resolved_at is not None:
        lines.append(f"resolved at {iso(note.resolved_at)}")
    if note.wasted_usd is not None:
        lines.append(f"wasted so far: ${note.wasted_usd:,.2f}")
    if note.stale:
        lines.append("(no fresh data: showing the last value)")
    if note.description:
        lines.append(note.description)
    fields = [
        {"type": "mrkdwn", "text": _cut(f"*{label}*\n{note.labels[label]}", FIELD_MAX)}
        for label in _WHERE_LABELS
        if note.labels.get(label)
    ]
    fields.append({"type": "mrkdwn", "text": f"*severity*\n{note.severity}"})
    blocks: list[dict[str, Any]] = [
        {
            "type": "header",
            "text": {"type": "plain_text", "text": _cut(note.headline(), HEADER_MAX)},
        },
        {
            "type": "section",
            "text": {"type": "mrkdwn", "text": _cut("\n".join(lines), SECTION_MAX)},
        },
        {"type": "section", "fields": fields[:FIELDS_MAX]},
    ]
    links = [(note.report_url, "Job report"), (note.alert_url, "Alert")]
    elements = [f"<{url}|{label}>" for url, label in links if url]
    if elements:
        blocks.append(
            {"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(elements)}]}
        )
    text = f"{icon} {note.headline()}: {note.condition()}"
    if note.wasted_usd is not None:
        text += f", ${note.wasted_usd:,.2f} wasted so far"
    return {"text": _cut(text, TEXT_MAX), "blocks": blocks}


class SlackNotifier:
    """Posts to a Slack incoming webhook URL (the URL is the secret; it is never logged)."""

    def __init__(self, channel: ChannelSpec, client: httpx.Client) -> None:
        self.channel = channel
        self.client = client

    def send(self, note: Notification) -> None:
        """Post ``note`` to Slack; DeliveryError on failure."""
        post_json(
            self.client,
            self.channel.url,
            content=dumps(render(note)),
            what=f"slack channel {self.channel.name}",
        )
