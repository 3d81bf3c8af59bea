"""Pure ingest checks: timestamps against the clock, dirty buckets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from service.db.ingest_samples import dirty_range
from service.errors import Forbidden, ValidationFailed
from service.usecases.ingest import check_node, check_times, parse_batch
from tests.support import make_batch

NOW = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)


def _batch(ts: datetime):
    import json

    return parse_batch(json.dumps(make_batch(start=ts)).encode())


def test_future_and_too_old_timestamps_are_named() -> None:
    oldest = NOW - timedelta(days=7)
    check_times(
        _batch(NOW + timedelta(seconds=299)), now=NOW, max_future_seconds=300, oldest=oldest
    )
    with pytest.raises(ValidationFailed) as exc:
        check_times(
            _batch(NOW + timedelta(seconds=301)), now=NOW, max_future_seconds=300, oldest=oldest
        )
    assert exc.value.field == "samples.0.ts"
    assert "future" in exc.value.message
    with pytest.raises(ValidationFailed, match="retention"):
        check_times(
            _batch(oldest - timedelta(seconds=1)), now=NOW, max_future_seconds=300, oldest=oldest
        )


def test_agent_token_node_must_match() -> None:
    check_node(_batch(NOW), token_node="node-a")
    check_node(_batch(NOW), token_node=None)  # admin
    with pytest.raises(Forbidden, match="node-a"):
        check_node(_batch(NOW), token_node="node-b")


def test_dirty_buckets_cover_every_minute_a_sample_can_change() -> None:
    ts = datetime(2026, 12, 2, 8, 0, 30, tzinfo=UTC)
    assert dirty_range(ts, ts, 60) == [
        datetime(2026, 12, 2, 7, 59, tzinfo=UTC),
        datetime(2026, 12, 2, 8, 0, tzinfo=UTC),
        datetime(2026, 12, 2, 8, 1, tzinfo=UTC),
    ]
    assert len(dirty_range(ts, ts + timedelta(minutes=10), 60)) == 13
