"""The delivery table, one row per case: what the agent and the notifiers do with an answer."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from service.delivery import (
    Action,
    Backoff,
    LogThrottle,
    Refusal,
    RetryPolicy,
    backoff_seconds,
    decide,
    parse_retry_after,
    refusal,
    rfc3339,
)

NOW = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
POLICY = RetryPolicy(base_seconds=1, cap_seconds=300, server_error_limit=3)

# status, parts, server errors before, retry-after, action, refusal, server errors after
TABLE = [
    (200, 3, 0, None, Action.SENT, None, 0),
    (204, 1, 2, None, Action.SENT, None, 0),
    # credentials (and redirects): keep everything and back off, never dead-letter
    (401, 1, 0, None, Action.KEEP, Refusal.CREDENTIALS, 0),
    (403, 5, 0, None, Action.KEEP, Refusal.CREDENTIALS, 0),
    (301, 1, 0, None, Action.KEEP, Refusal.CREDENTIALS, 0),
    # bad content: split a batch of several polls, dead-letter a single one
    (400, 3, 0, None, Action.SPLIT, Refusal.CONTENT, 0),
    (422, 1, 0, None, Action.DEAD_LETTER, Refusal.CONTENT, 0),
    (413, 2, 0, None, Action.SPLIT, Refusal.CONTENT, 0),
    (404, 1, 2, None, Action.DEAD_LETTER, Refusal.CONTENT, 0),
    # busy or down: retry without limit, however often it happened before
    (None, 1, 0, None, Action.RETRY, Refusal.BUSY, 0),
    (408, 1, 0, None, Action.RETRY, Refusal.BUSY, 0),
    (429, 4, 0, 30.0, Action.RETRY, Refusal.BUSY, 0),
    (503, 1, 9, None, Action.RETRY, Refusal.BUSY, 9),
    # other 5xx: retried, and the Nth in a row sets the item aside (split first if several)
    (500, 1, 0, None, Action.RETRY, Refusal.SERVER, 1),
    (502, 3, 1, None, Action.RETRY, Refusal.SERVER, 2),
    (500, 3, 2, None, Action.SPLIT, Refusal.SERVER, 3),
    (500, 1, 2, None, Action.SET_ASIDE, Refusal.SERVER, 3),
    (504, 1, 7, None, Action.SET_ASIDE, Refusal.SERVER, 8),
]


@pytest.mark.parametrize(
    ("status", "parts", "before", "retry_after", "action", "why", "after"), TABLE
)
def test_the_table(
    status: int | None,
    parts: int,
    before: int,
    retry_after: float | None,
    action: Action,
    why: Refusal | None,
    after: int,
) -> None:
    d = decide(
        status,
        parts=parts,
        failures=2,
        server_errors=before,
        retry_after_seconds=retry_after,
        policy=POLICY,
        rng=random.Random(0),
    )
    assert (d.action, d.refusal, d.server_errors) == (action, why, after)
    assert refusal(status) is why
    if action in (Action.KEEP, Action.RETRY):
        assert 2.0 <= d.delay_seconds <= 4.0 or d.delay_seconds == retry_after  # backoff of 2
    if action in (Action.SENT, Action.SPLIT, Action.DEAD_LETTER):
        assert d.delay_seconds == 0.0


def test_no_refusal_ever_drops_or_dead_letters_after_many_failures() -> None:
    rng = random.Random(3)
    for status in (None, 401, 403, 408, 429, 500, 502, 503):
        for n in (0, 10, 1000):
            d = decide(status, parts=1, failures=n, server_errors=n, policy=POLICY, rng=rng)
            assert d.action is not Action.DEAD_LETTER
            assert 0 < d.delay_seconds <= POLICY.set_aside_cap_seconds


def test_retry_after_is_honoured_up_to_an_hour() -> None:
    rng = random.Random(1)
    d = decide(429, parts=1, failures=0, server_errors=0, retry_after_seconds=120,
               policy=POLICY, rng=rng)  # fmt: skip
    assert d.delay_seconds == 120
    d = decide(503, parts=1, failures=0, server_errors=0, retry_after_seconds=10**9,
               policy=POLICY, rng=rng)  # fmt: skip
    assert d.delay_seconds == 3600


def test_set_aside_waits_grow_and_are_capped() -> None:
    rng = random.Random(2)
    waits = [
        decide(500, parts=1, failures=0, server_errors=n, policy=POLICY, rng=rng).delay_seconds
        for n in range(2, 12)
    ]
    assert 30 <= waits[0] <= 60  # the first set-aside: half to all of the base minute
    assert waits[-1] <= POLICY.set_aside_cap_seconds
    assert waits[-1] > waits[0]


def test_backoff_is_equal_jitter_doubling_to_the_cap() -> None:
    rng = random.Random(1)
    for n in range(12):
        ceiling = min(30.0, 2.0**n)
        d = backoff_seconds(n, base_seconds=1, cap_seconds=30, rng=rng)
        assert ceiling / 2 <= d <= ceiling
    assert len({backoff_seconds(4, base_seconds=1, cap_seconds=30, rng=rng) for _ in range(9)}) > 1
    assert backoff_seconds(10**6, base_seconds=1, cap_seconds=30, rng=rng) <= 30


def test_backoff_counter_grows_resets_and_honours_retry_after() -> None:
    b = Backoff(base_seconds=1, cap_seconds=30, rng=random.Random(1))
    delays = [b.next_delay() for _ in range(8)]
    for n, d in enumerate(delays):
        assert min(30, 2**n) * 0.5 <= d <= min(30, 2**n)
    assert b.next_delay(retry_after_seconds=120) >= 120
    b.reset()
    assert b.next_delay() <= 1.0


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("7", 7.0),
        (" 12 ", 12.0),
        ("-3", 0.0),
        ("Wed, 02 Dec 2026 08:00:30 GMT", 30.0),
        ("Wed, 02 Dec 2026 07:59:00 GMT", 0.0),  # a date in the past: go now
        ("soon", None),
        ("", None),
        (None, None),
        ("nan", None),
    ],
)
def test_retry_after_seconds_and_http_date(header: str | None, seconds: float | None) -> None:
    assert parse_retry_after(header, now=NOW) == seconds


def test_rfc3339_is_utc_with_z() -> None:
    from datetime import timezone

    cet = timezone(timedelta(hours=1))
    assert rfc3339(datetime(2026, 12, 2, 9, 0, 1, tzinfo=cet)) == "2026-12-02T08:00:01Z"
    assert rfc3339(NOW + timedelta(microseconds=5)) == "2026-12-02T08:00:00.000005Z"


def test_log_throttle_says_once_a_minute_per_key() -> None:
    t = LogThrottle(60)
    assert t.due("credentials", 0.0)
    assert not t.due("credentials", 59.0)
    assert t.due("busy", 59.0)
    assert t.due("credentials", 60.0)
