"""Sending encoded batches to the central service, and deciding what a failure means.

``classify`` and ``Backoff`` are pure; ``Shipper`` does the HTTP with an injected httpx client.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum

import httpx

from service.collectors.transport import (
    HttpxTransport,
    StdlibTransport,
    Transport,
    TransportError,
)


class Outcome(StrEnum):
    """What to do with a batch after one delivery attempt."""

    SENT = "sent"
    RETRY = "retry"  # 5xx, 429, 408 or a network error: keep it and try again later
    DEAD = "dead"  # any other 4xx: the server will never take it; dead-letter it


@dataclass(frozen=True, slots=True)
class Result:
    """One delivery attempt: outcome, HTTP status (None for network errors) and the message."""

    outcome: Outcome
    status: int | None
    message: str
    retry_after_seconds: float | None = None


def parse_retry_after(value: str | None, *, now: datetime) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def classify(status: int, body: str, retry_after: str | None, *, now: datetime) -> Result:
    """The outcome of an HTTP response with ``status``."""
    if 200 <= status < 300:
        return Result(Outcome.SENT, status, "")
    if status in (408, 429) or status >= 500:
        return Result(Outcome.RETRY, status, body[:2000], parse_retry_after(retry_after, now=now))
    return Result(Outcome.DEAD, status, body[:10_000])


class Backoff:
    """Jittered exponential backoff in seconds: base * 2^n capped, times a factor in [0.5, 1]."""

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
        """The wait before the next attempt; never shorter than the server's Retry-After."""
        raw = min(self.cap, self.base * 2.0 ** min(self.failures, 30))
        self.failures += 1
        delay = raw * (0.5 + 0.5 * self.rng.random())
        if retry_after_seconds is not None:
            delay = max(delay, min(retry_after_seconds, 3600.0))
        return delay

    def reset(self) -> None:
        """Forget past failures after a success."""
        self.failures = 0


class Shipper:
    """POSTs gzipped batches to ``{central_url}/api/v1/ingest`` with the node's token."""

    def __init__(
        self,
        *,
        central_url: str,
        token: str | None,
        client: httpx.Client | None = None,
        transport: Transport | None = None,
        timeout_seconds: float = 30.0,
    ) -> None:
        self.url = central_url.rstrip("/") + "/api/v1/ingest"
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.headers = headers
        if transport is None:
            transport = (
                HttpxTransport(client)
                if client is not None
                else StdlibTransport(timeout_seconds=timeout_seconds)
            )
        self.transport = transport

    def send(self, body: bytes) -> Result:
        """One delivery attempt of a gzipped batch."""
        now = datetime.now(UTC)
        try:
            status, text, retry_after = self.transport.post(self.url, body, self.headers)
        except TransportError as exc:
            return Result(Outcome.RETRY, None, str(exc))
        return classify(status, text, retry_after, now=now)

    def close(self) -> None:
        """Close the HTTP connection."""
        self.transport.close()
