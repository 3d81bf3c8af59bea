"""SMTP replies and Slack API errors fall in the delivery table's rows as HTTP answers do."""

from __future__ import annotations

import random

from service.delivery import Action, RetryPolicy, decide
from service.notify.email import http_status_of
from service.notify.slack_dm import status_of_error


def _action(status: int | None, failures: int = 0) -> Action:
    return decide(
        status,
        parts=1,
        failures=failures,
        server_errors=failures,
        policy=RetryPolicy(),
        rng=random.Random(1),
    ).action


def test_smtp_replies() -> None:
    assert _action(http_status_of(None)) is Action.RETRY  # refused, timed out, dropped
    assert _action(http_status_of(421)) is Action.RETRY
    assert _action(http_status_of(451)) is Action.RETRY
    assert _action(http_status_of(452), failures=2) is Action.SET_ASIDE  # 4xx again and again
    assert _action(http_status_of(535)) is Action.KEEP  # the login was refused
    assert _action(http_status_of(550)) is Action.DEAD_LETTER
    assert _action(http_status_of(554)) is Action.DEAD_LETTER


def test_slack_errors() -> None:
    assert _action(status_of_error("invalid_auth")) is Action.KEEP
    assert _action(status_of_error("token_revoked")) is Action.KEEP
    assert _action(status_of_error("ratelimited")) is Action.RETRY
    assert _action(status_of_error("internal_error")) is Action.RETRY
    assert _action(status_of_error("channel_not_found")) is Action.DEAD_LETTER
    assert _action(status_of_error("invalid_blocks")) is Action.DEAD_LETTER
