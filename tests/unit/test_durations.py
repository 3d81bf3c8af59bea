from __future__ import annotations

import pytest

from service.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("15m", 900),
        ("4h", 14400),
        ("1h30m", 5400),
        ("7d", 604800),
        ("250ms", 0.25),
        ("45", 45),
    ],
)
def test_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "m", "15 minutes", "1x", "-5m", "5m3"])
def test_parse_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(bad)


@pytest.mark.parametrize("seconds", [30, 900, 5400, 604800, 90061])
def test_round_trip(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == seconds
