"""What to do with a delivery that did not go through, written once for the agent and notifiers.

The agent's ingest batches and every notifier's messages follow one table (docs/agent.md):

=====================================  =================================================
answer                                 what the sender does
=====================================  =================================================
2xx                                    delivered: forget the item
401 / 403 (credentials), 3xx           keep it, back off, log once a minute; never
                                       dead-letter (the operator fixes the token or URL
                                       and the data still arrives)
other 4xx (bad content)                split the item part by part (poll by poll), ship
                                       the good parts, dead-letter only the bad part
408 / 429 / 503, or no answer at all   retry without limit, honouring Retry-After
other 5xx                              retry with backoff; after ``server_error_limit``
                                       in a row, set the item aside behind newer work
                                       and retry it later; never drop it
=====================================  =================================================

Everything here is pure: no clock, no HTTP. ``now`` and the random source come in.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum

RETRY_AFTER_MAX_SECONDS = 3600.0  # a server asking for more is obeyed for an hour at most


class Refusal(StrEnum):
    """Why an answer was not a delivery: the rows of the table."""

    CREDENTIALS = "credentials"  # 401, 403 and redirects (never followed): a configuration fault
    CONTENT = "content"  # other 4xx: this item will never be taken as it is
    BUSY = "busy"  # 408, 429, 503 or no answer: the receiver is overloaded or down
    SERVER = "server"  # other 5xx: maybe the receiver, maybe this item


class Action(StrEnum):
    """What the sender does with the item after one attempt."""

    SENT = "sent"
    KEEP = "keep"  # keep every part, wait ``delay_seconds`` before sending anything
    RETRY = "retry"  # keep every part, wait ``delay_seconds`` before sending anything
    SPLIT = "split"  # send the parts one by one now, each judged by this table again
    DEAD_LETTER = "dead_letter"  # write the (single-part) item aside for a human; never retried
    SET_ASIDE = "set_aside"  # this item waits ``delay_seconds``; newer items go first meanwhile


def refusal(status: int | None) -> Refusal | None:
    """The table row of HTTP ``status`` (None: no answer came); None for a 2xx."""
    if status is None or status in (408, 429, 503):
        return Refusal.BUSY
    if 200 <= status < 300:
        return None
    if status in (401, 403) or 300 <= status < 400:
        return Refusal.CREDENTIALS
    if 400 <= status < 500:
        return Refusal.CONTENT
    return Refusal.SERVER  # 5xx, and anything a receiver should never answer (1xx, 6xx)


def backoff_seconds(
    failures: int, *, base_seconds: float, cap_seconds: float, rng: random.Random
) -> float:
    """Seconds to wait after ``failures`` failed attempts in a row (0-based), with equal jitter.

    The ceiling doubles from ``base_seconds`` up to ``cap_seconds``; the wait is half the ceiling
    plus a uniform random part of up to the other half, so senders spread out and never retry
    at once.
    """
    ceiling = min(cap_seconds, base_seconds * 2.0 ** min(max(failures, 0), 60))
    return ceiling / 2 + rng.uniform(0.0, ceiling / 2)


def parse_retry_after(value: str | None, *, now: datetime) -> float | None:
    """Seconds to wait by a Retry-After header (delta-seconds or an HTTP date) as of ``now``."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if seconds == seconds else None  # NaN says nothing
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def webhook_key_problem(key: str) -> str | None:
    """Why ``key`` is not a Standard Webhooks signing key (``whsec_<base64>``), or None."""
    import base64
    import binascii

    if not key.startswith("whsec_"):
        return "must be a Standard Webhooks key like whsec_<base64>"
    try:
        base64.b64decode(key[len("whsec_") :], validate=True)
    except binascii.Error:
        return "the part after whsec_ must be base64"
    return None


def rfc3339(ts: datetime) -> str:
    """``ts`` as RFC 3339 UTC text with a Z suffix (an aware datetime, any zone)."""
    return ts.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The numbers of the table: backoff in seconds, and when a server error sets an item aside."""

    base_seconds: float = 1.0
    cap_seconds: float = 300.0
    server_error_limit: int = 3  # other-5xx answers in a row before the item is set aside
    set_aside_base_seconds: float = 60.0
    set_aside_cap_seconds: float = 1800.0


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one attempt.

    ``delay_seconds`` is the wait before the sender tries again: for KEEP and RETRY the whole
    sender waits (the receiver is refusing everything); for SET_ASIDE only this item waits.
    ``server_errors`` is the item's new count of other-5xx answers in a row.
    """

    action: Action
    refusal: Refusal | None
    delay_seconds: float = 0.0
    server_errors: int = 0


def decide(
    status: int | None,
    *,
    parts: int,
    failures: int,
    server_errors: int,
    retry_after_seconds: float | None = None,
    policy: RetryPolicy,
    rng: random.Random,
) -> Decision:
    """The table applied to one attempt of an item of ``parts`` parts.

    ``failures`` counts the sender's failed attempts in a row before this one (it sets the
    backoff); ``server_errors`` counts this item's other-5xx answers in a row before this one.
    """
    why = refusal(status)
    if why is None:
        return Decision(Action.SENT, None)
    if why is Refusal.CONTENT:
        return Decision(Action.SPLIT if parts > 1 else Action.DEAD_LETTER, why)
    wait = backoff_seconds(
        failures, base_seconds=policy.base_seconds, cap_seconds=policy.cap_seconds, rng=rng
    )
    if retry_after_seconds is not None:
        wait = max(wait, min(retry_after_seconds, RETRY_AFTER_MAX_SECONDS))
    if why is Refusal.CREDENTIALS:
        return Decision(Action.KEEP, why, wait, server_errors)
    if why is Refusal.BUSY:
        return Decision(Action.RETRY, why, wait, server_errors)
    errors = server_errors + 1
    if errors < policy.server_error_limit:
        return Decision(Action.RETRY, why, wait, errors)
    if parts > 1:  # which part is at fault is unknown: judge them one by one
        return Decision(Action.SPLIT, why, 0.0, errors)
    aside = backoff_seconds(
        errors - policy.server_error_limit,
        base_seconds=policy.set_aside_base_seconds,
        cap_seconds=policy.set_aside_cap_seconds,
        rng=rng,
    )
    return Decision(Action.SET_ASIDE, why, max(aside, wait), errors)


class Backoff:
    """A sender's failures in a row and the wait they give, by ``backoff_seconds``."""

    def __init__(
        self,
        *,
        base_seconds: float = 1.0,
        cap_seconds: float = 300.0,
        rng: random.Random | None = None,
    ) -> None:
        self.base = base_seconds
        self.cap = cap_seconds
        self.failures = 0
        self.rng = rng or random.Random()

    def next_delay(self, retry_after_seconds: float | None = None) -> float:
        """Count one more failure; the wait before the next attempt, never below Retry-After."""
        delay = backoff_seconds(
            self.failures, base_seconds=self.base, cap_seconds=self.cap, rng=self.rng
        )
        self.failures += 1
        if retry_after_seconds is not None:
            delay = max(delay, min(retry_after_seconds, RETRY_AFTER_MAX_SECONDS))
        return delay

    def reset(self) -> None:
        """Forget past failures after a success."""
        self.failures = 0


@dataclass
class LogThrottle:
    """Says whether a message keyed ``key`` is due, at most once per ``every_seconds``."""

    every_seconds: float = 60.0
    _last: dict[str, float] = field(default_factory=dict)

    def due(self, key: str, now_seconds: float) -> bool:
        """True (and remembered) when ``key`` was not logged within the last period."""
        last = self._last.get(key)
        if last is not None and now_seconds - last < self.every_seconds:
            return False
        self._last[key] = now_seconds
        return True


def quiet_http_logs() -> None:
    """Keep httpx from logging each request at INFO (a line per batch; webhook URLs are secret)."""
    for name in ("httpx", "httpcore"):
        lg = logging.getLogger(name)
        if lg.getEffectiveLevel() < logging.WARNING:
            lg.setLevel(logging.WARNING)
