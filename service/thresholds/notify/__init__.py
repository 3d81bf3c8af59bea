"""Sending notifications: the outbox dispatcher and one notifier module per channel type."""

from __future__ import annotations

import httpx

from service.thresholds.notify.alertmanager import AlertmanagerNotifier
from service.thresholds.notify.base import Notification, Notifier
from service.thresholds.notify.slack import SlackNotifier
from service.thresholds.notify.webhook import WebhookNotifier
from service.thresholds.policy import ChannelSpec

__all__ = ["Notification", "Notifier", "notifier_for"]


def notifier_for(channel: ChannelSpec, client: httpx.Client) -> Notifier:
    """The notifier of ``channel``'s type, sending through ``client``."""
    if channel.type == "slack":
        return SlackNotifier(channel, client)
    if channel.type == "webhook":
        return WebhookNotifier(channel, client)
    return AlertmanagerNotifier(channel, client)
