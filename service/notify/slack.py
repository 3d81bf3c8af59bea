"""Slack incoming-webhook notifier: ``text`` plus Block Kit ``blocks`` within Slack's limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from service.core.slack_text import (
    TEXT_MAX,
    cut_escaped,
    escape,
    field_text,
    message_blocks,
)
from service.notify.base import Notification, dumps, iso, post_json
from service.notify.envelope import Envelope
from service.thresholds.policy import ChannelSpec
from service.vocabulary import ALERT_LABELS

# Every alert label but the policy, which the header already names: at most FIELDS_MAX.
_FIELD_LABELS = tuple(label for label in ALERT_LABELS if label != "policy")


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
    waste = note.verdict.waste_words()
    if waste:
        lines.append(waste)
    verdict = note.verdict.cause_words()
    if verdict:
        lines.append(verdict)
    if note.stale:
        lines.append("(no fresh data: showing the last value)")
    if note.description:
        lines.append(note.description)
    labels = note.alert_labels()
    fields = (field_text(label, labels[label]) for label in _FIELD_LABELS if labels.get(label))
    links = [(note.report_url, "Job report"), (note.alert_url, "Alert")]
    elements = " · ".join(f"<{escape(url)}|{label}>" for url, label in links if url)
    blocks = message_blocks(note.headline(), "\n".join(lines), fields, elements)
    text = f"{note.headline()}: {note.notice or note.condition()}"
    if note.verdict.waste_usd is not None:
        text += f", waste so far ${note.verdict.waste_usd:,.2f}"
    if note.verdict.top_cause:
        text += f"; top cause: {note.verdict.top_cause}"
    return {"text": f"{icon} {cut_escaped(text, TEXT_MAX - len(icon) - 1)}", "blocks": blocks}


@dataclass(frozen=True, slots=True)
class SlackNotifier:
    """Posts to a Slack incoming webhook URL (the URL is the secret; it is never logged)."""

    channel: ChannelSpec
    client: httpx.Client

    def send(self, note: Notification) -> None:
        """Post ``note`` to Slack; DeliveryError on failure."""
        self._post(render(note))

    def send_message(self, env: Envelope) -> None:
        """Post a rendered message (its Slack text and blocks) to the webhook's channel."""
        self._post({"text": env.message.slack_text, "blocks": env.message.slack_blocks})

    def _post(self, message: dict[str, Any]) -> None:
        """Post one Slack message document; DeliveryError on failure."""
        post_json(
            self.client,
            self.channel.url,
            content=dumps(message),
            what=f"slack channel {self.channel.name}",
        )
