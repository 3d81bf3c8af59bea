"""A message for people as queued: its forms (plain text, HTML, Slack text and blocks) and
its recipients; below every notifier, which sends it, and the renderers, which make it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from service.core.slack_text import BLOCKS_MAX, TEXT_MAX


class Message(BaseModel):
    """One message for people in every form a channel needs; rendered once, sent as is."""

    subject: str = Field(min_length=1, max_length=998)  # one e-mail header line at most
    text: str
    html: str
    slack_text: str = Field(max_length=TEXT_MAX)
    slack_blocks: list[dict[str, Any]] = Field(default_factory=list, max_length=BLOCKS_MAX)
    # A periodic report's one-click link that stops it (RFC 8058): mail sends it as the
    # List-Unsubscribe header, beside the link in the body.
    unsubscribe_url: str | None = None


class Envelope(BaseModel):
    """A message to its recipients (e-mail addresses, or one Slack user or channel id), as
    queued in the outbox; ``kind`` tells it apart from an alert's ``Notification``."""

    delivery_id: str
    kind: Literal["message"] = "message"
    to: list[str] = Field(min_length=1)
    cc: list[str] = Field(default_factory=list)
    message: Message
