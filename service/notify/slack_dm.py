"""Slack direct-message notifier: chat.postMessage with the bot token to a user or channel id.

Slack answers 200 with ``{"ok": false, "error": ...}`` for most refusals; those map onto the
delivery table: a bad or revoked token is credentials (kept, retried), an unknown user or a
malformed message is content (failed), Slack's own errors are retried.
"""

from __future__ import annotations

import json

import httpx

from service.errors import DeliveryError, ValidationFailed
from service.notify.base import Notification, dumps, post_json
from service.notify.envelope import Envelope
from service.notify.message import message_of_notification
from service.thresholds.policy import ChannelSpec

CREDENTIAL_ERRORS = frozenset(
    {"not_authed", "invalid_auth", "token_revoked", "token_expired", "account_inactive",
     "missing_scope", "not_allowed_token_type", "no_permission", "ekm_access_denied"}
)  # fmt: skip
BUSY_ERRORS = frozenset({"ratelimited", "service_unavailable", "request_timeout"})
SERVER_ERRORS = frozenset({"internal_error", "fatal_error"})


def status_of_error(error: str) -> int:
    """The HTTP status whose row of the delivery table a Slack API ``error`` falls in."""
    if error in CREDENTIAL_ERRORS:
        return 401
    if error in BUSY_ERRORS:
        return 503
    if error in SERVER_ERRORS:
        return 500
    return 400  # channel_not_found, user_not_found, invalid_blocks, msg_too_long, ...


class SlackDMNotifier:
    """Posts to Slack's chat.postMessage (the channel's URL) with the bot token of the settings."""

    def __init__(self, channel: ChannelSpec, client: httpx.Client, token: str | None) -> None:
        self.channel = channel
        self.client = client
        self.token = token

    def send(self, note: Notification) -> None:
        """Message an alert's notification to the channel's fixed recipients (one each)."""
        if not self.channel.to:
            raise ValidationFailed("to", f"slack_dm channel {self.channel.name} has no recipients")
        for to in self.channel.to:
            env = Envelope(
                delivery_id=note.delivery_id, to=[to], message=message_of_notification(note)
            )
            self.send_message(env)

    def send_message(self, env: Envelope) -> None:
        """Post ``env`` to its one recipient (its copies each get their own post)."""
        if not self.token:
            raise ValidationFailed("slack_bot_token", "GPUWARDEN_SLACK_BOT_TOKEN is not set")
        what = f"slack_dm channel {self.channel.name}"
        for to in [*env.to, *env.cc]:
            body = {
                "channel": to,
                "text": env.message.slack_text,
                "blocks": env.message.slack_blocks,
            }
            response = post_json(
                self.client,
                self.channel.url,
                content=dumps(body),
                headers={
                    "authorization": f"Bearer {self.token}",
                    "content-type": "application/json; charset=utf-8",
                },
                what=what,
            )
            try:
                answer = json.loads(response.content or b"{}")
            except ValueError:
                answer = {}
            if isinstance(answer, dict) and answer.get("ok") is False:
                error = str(answer.get("error") or "unknown_error")[:100]
                raise DeliveryError(f"{what}: Slack said {error}", status=status_of_error(error))
