"""Sending notifications: the outbox dispatcher and one notifier module per channel type."""

from __future__ import annotations

from typing import Protocol, assert_never

import httpx

from service.errors import ValidationFailed
from service.notify.alertmanager import AlertmanagerNotifier
from service.notify.base import Notification, Notifier
from service.notify.email import EmailNotifier
from service.notify.envelope import Envelope
from service.notify.slack import SlackNotifier
from service.notify.slack_dm import SlackDMNotifier
from service.notify.webhook import WebhookNotifier
from service.settings import Settings
from service.thresholds.policy import ChannelSpec, ChannelType

__all__ = ["MessageNotifier", "Notification", "Notifier", "notifier_for", "send_envelope"]


class MessageNotifier(Protocol):
    """Sends a rendered message (an owner notice, a report) to its recipients."""

    def send_message(self, env: Envelope) -> None: ...


def notifier_for(channel: ChannelSpec, client: httpx.Client, settings: Settings) -> Notifier:
    """The notifier of ``channel``'s type, sending through ``client`` (HTTP) or SMTP; a type
    without a notifier is an error (mypy: a ``ChannelType`` without its branch)."""
    kind: ChannelType = channel.type
    match kind:
        case "slack":
            return SlackNotifier(channel, client)
        case "webhook":
            return WebhookNotifier(channel, client)
        case "email":
            return EmailNotifier(channel, settings)
        case "slack_dm":
            return SlackDMNotifier(channel, client, settings.slack_bot_token)
        case "alertmanager":
            return AlertmanagerNotifier(channel, client)
        case _:
            assert_never(kind)


def send_envelope(
    channel: ChannelSpec, client: httpx.Client, settings: Settings, env: Envelope
) -> None:
    """Send a rendered message through ``channel``: e-mail, a Slack DM, or a Slack webhook's
    channel; ValidationFailed for a channel type that carries alerts only."""
    notifier = notifier_for(channel, client, settings)
    if not hasattr(notifier, "send_message"):
        raise ValidationFailed(
            "channel", f"{channel.type} channel {channel.name} takes no messages"
        )
    notifier.send_message(env)
