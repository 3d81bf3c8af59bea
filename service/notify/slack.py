"""Slack incoming-webhook notifier: ``text`` plus Block Kit ``blocks`` within Slack's limits."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx

from service.notify.base import Notification, dumps, iso, post_json
from service.thresholds.policy import ChannelSpec
from service.vocabulary import ALERT_LABELS

if TYPE_CHECKING:
    from service.notify.message import Envelope

# Slack's documented limits: header text 150 chars, section text 3000, at most 10 fields of
# 2000 chars each, 50 blocks; top-level text is truncated past 40,000 (we keep it short).
HEADER_MAX = 150
SECTION_MAX = 3000
FIELD_MAX = 2000
FIELDS_MAX = 10
TEXT_MAX = 3000

# Every alert label but the policy, which the header already names: at most FIELDS_MAX.
_FIELD_LABELS = tuple(label for label in ALERT_LABELS if label != "policy")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def escape(text: str) -> str:
    """``text`` safe inside Slack mrkdwn: ``&``, ``<`` and ``>`` as the entities Slack expects.

    Unescaped, ``<!channel>`` in a description or a label pings the whole channel and a stray
    ``<`` turns the text up to the next ``>`` into a link.
    """
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cut_escaped(text: str, limit: int) -> str:
    """Escape, then cut to ``limit`` characters without splitting an entity."""
    out = escape(text)
    if len(out) <= limit:
        return out
    cut = out[: limit - 1]
    amp = cut.rfind("&")
    if amp != -1 and ";" not in cut[amp:]:
        cut = cut[:amp]
    return cut + "…"


def render(note: Notification) -> dict[str, Any]:
    """The Slack message: what, where, since when, value vs threshold, dollars so far, link."""
    icon = {"firing": ":rotating_light:", "resolved": ":white_check_mark:"}[note.status]
    since = iso(note.fired_at or note.active_since)
    # Our own text holds "<" and ">" too (the condition's operator), so everything is escaped.
    lines = [note.condition(), f"since {since}"]
    if note.notice:
        lines.insert(0, note.notice)
    if note.status == "resolved" and note.resolved_at is not None:
        lines.append(f"resolved at {iso(note.resolved_at)}")
    waste = note.waste()
    if waste:
        lines.append(waste)
    verdict = note.verdict()
    if verdict:
        lines.append(verdict)
    if note.stale:
        lines.append("(no fresh data: showing the last value)")
    if note.description:
        lines.append(note.description)
    labels = note.alert_labels()
    fields = [
        {"type": "mrkdwn", "text": _cut_escaped(f"*{label}*\n{labels[label]}", FIELD_MAX)}
        for label in _FIELD_LABELS
        if labels.get(label)
    ]
    blocks: list[dict[str, Any]] = [
        {
            "type": "header",
            "text": {"type": "plain_text", "text": _cut(note.headline(), HEADER_MAX)},
        },
        {
            "type": "section",
            "text": {"type": "mrkdwn", "text": _cut_escaped("\n".join(lines), SECTION_MAX)},
        },
        {"type": "section", "fields": fields[:FIELDS_MAX]},
    ]
    links = [(note.report_url, "Job report"), (note.alert_url, "Alert")]
    elements = [f"<{escape(url)}|{label}>" for url, label in links if url]
    if elements:
        blocks.append(
            {"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(elements)}]}
        )
    text = f"{note.headline()}: {note.notice or note.condition()}"
    if note.waste_usd is not None:
        text += f", waste so far ${note.waste_usd:,.2f}"
    if note.top_cause:
        text += f"; top cause: {note.top_cause}"
    return {"text": f"{icon} {_cut_escaped(text, TEXT_MAX - len(icon) - 1)}", "blocks": blocks}


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

    def send_message(self, env: Envelope) -> None:
        """Post a rendered message (its Slack text and blocks) to the webhook's channel."""
        post_json(
            self.client,
            self.channel.url,
            content=dumps({"text": env.message.slack_text, "blocks": env.message.slack_blocks}),
            what=f"slack channel {self.channel.name}",
        )
