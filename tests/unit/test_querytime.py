"""Times and durations as people write them: the one parser the REST API and the CLI share."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from service.core.querytime import parse_instant, parse_seconds, time_range
from service.errors import ValidationFailed

NOW = datetime(2026, 12, 3, 7, 30, 15, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("today", datetime(2026, 12, 3, tzinfo=UTC)),
        ("today-6d", datetime(2026, 11, 27, tzinfo=UTC)),
        ("Today+1d", datetime(2026, 12, 4, tzinfo=UTC)),
        ("-1h", NOW - timedelta(hours=1)),
        ("now-30m", NOW - timedelta(minutes=30)),
        ("-1h30m", NOW - timedelta(minutes=90)),
        ("+5m", NOW + timedelta(minutes=5)),
        ("2026-12-01", datetime(2026, 12, 1, tzinfo=UTC)),
        ("2026-12-01T08:00:00Z", datetime(2026, 12, 1, 8, tzinfo=UTC)),
        ("2026-12-01T10:00:00+02:00", datetime(2026, 12, 1, 8, tzinfo=UTC)),
        ("1764748800", datetime(2025, 12, 3, 8, tzinfo=UTC)),
    ],
)
def test_instants(text: str, expected: datetime) -> None:
    got = parse_instant(text, now=NOW)
    assert got == expected and got.tzinfo is not None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("2026-12-01T08:00:00", "no timezone"),
        ("yesterday", "RFC 3339"),
        ("1h", "write -1h"),
        ("-1.5h", "RFC 3339"),
        ("today-soon", "today-6d"),
        ("todaynow-1h", "RFC 3339"),
        ("2026-13-01", "not a calendar date"),
    ],
)
def test_bad_instants_say_what_is_accepted(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_instant(text, now=NOW)


def test_durations_are_prometheus_durations_or_seconds() -> None:
    assert parse_seconds("10s") == 10
    assert parse_seconds("1h30m") == 5400
    assert parse_seconds("2.5") == 2.5
    for bad in ("0", "1.5h", "30m1h", "-5", "soon"):
        with pytest.raises(ValueError):
            parse_seconds(bad)


def test_time_range_defaults_since_and_errors_name_the_parameter() -> None:
    assert time_range(start=None, end=None, since=None, now=NOW, default_seconds=60) == (
        NOW - timedelta(seconds=60),
        NOW,
    )
    assert time_range(start=None, end="now", since="1h", now=NOW, default_seconds=60) == (
        NOW - timedelta(hours=1),
        NOW,
    )
    assert time_range(
        start="2026-12-01", end="2026-12-02", since=None, now=NOW, default_seconds=60
    ) == (datetime(2026, 12, 1, tzinfo=UTC), datetime(2026, 12, 2, tzinfo=UTC))
    for kwargs, field in (
        ({"start": "-1h", "since": "1h"}, "since"),
        ({"since": "1x"}, "since"),
        ({"start": "tomorrow"}, "start"),
        ({"end": "2026-12-01T00:00:00"}, "end"),
        ({"start": "now"}, "start"),
    ):
        args = {"start": None, "end": None, "since": None} | kwargs
        with pytest.raises(ValidationFailed) as err:
            time_range(**args, now=NOW, default_seconds=60)
        assert err.value.field == field
