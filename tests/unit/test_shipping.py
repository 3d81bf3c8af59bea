"""Pure shipping decisions (outcome per status, Retry-After, backoff) and the bounded spool."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path

from service.collectors.shipper import Backoff, Outcome, classify, parse_retry_after
from service.collectors.spool import Spool

NOW = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)


def test_status_decides_sent_retry_or_dead():
    assert classify(200, "", None, now=NOW).outcome is Outcome.SENT
    for status in (500, 502, 503, 429, 408):
        assert classify(status, "busy", None, now=NOW).outcome is Outcome.RETRY
    for status in (400, 401, 403, 404, 413, 422):
        r = classify(status, '{"detail":"samples.3.ts: bad"}', None, now=NOW)
        assert r.outcome is Outcome.DEAD
        assert "samples.3.ts" in r.message


def test_retry_after_seconds_and_http_date():
    assert parse_retry_after("7", now=NOW) == 7.0
    assert parse_retry_after("Wed, 02 Dec 2026 08:00:30 GMT", now=NOW) == 30.0
    assert parse_retry_after("soon", now=NOW) is None
    assert classify(429, "", "12", now=NOW).retry_after_seconds == 12.0


def test_backoff_grows_jittered_capped_and_honours_retry_after():
    b = Backoff(base_seconds=1, cap_seconds=30, rng=random.Random(1))
    delays = [b.next_delay() for _ in range(8)]
    for n, d in enumerate(delays):
        raw = min(30, 2**n)
        assert raw * 0.5 <= d <= raw
    assert len(set(delays)) == len(delays)  # jittered, so agents do not retry in lockstep
    assert b.next_delay(retry_after_seconds=120) >= 120
    b.reset()
    assert b.next_delay() <= 1.0


def test_spool_is_fifo_and_survives_reopening(tmp_path: Path):
    path = tmp_path / "spool.sqlite"
    s = Spool(path, max_bytes=10_000)
    for i in range(3):
        s.push(f"batch-{i}".encode())
    s.close()
    s = Spool(path, max_bytes=10_000)
    assert s.depth == 3
    seen = []
    while (item := s.oldest()) is not None:
        seen.append(item[1])
        s.remove(item[0])
    assert seen == [b"batch-0", b"batch-1", b"batch-2"]
    assert s.depth == 0 and s.bytes == 0


def test_spool_at_its_cap_drops_the_oldest_and_counts(tmp_path: Path):
    s = Spool(tmp_path / "spool.sqlite", max_bytes=1000)
    dropped = sum(s.push(bytes([i]) * 100) for i in range(15))
    assert dropped == 5 and s.dropped_total == 5
    assert s.depth == 10 and s.bytes == 1000
    first = s.oldest()
    assert first is not None and first[1] == bytes([5]) * 100
    assert s.push(b"x" * 5000) == 1  # larger than the whole spool: dropped, counted
    assert s.depth == 10
