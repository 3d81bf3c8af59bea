from __future__ import annotations

import pytest

from service.core.durations import parse_duration, parse_duration_param


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("15m", 900),
        ("4h", 14400),
        ("1h30m", 5400),
        ("7d", 604800),
        ("2w", 1209600),
        ("1y", 31536000),
        ("250ms", 0.25),
        ("1s250ms", 1.25),
        ("1d2h3m4s5ms", 93784.005),
        ("0", 0),
        ("0s", 0),
    ],
)
def test_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "bad",
    # What Prometheus's model.ParseDuration refuses: units out of order or repeated, fractions,
    # bare numbers other than 0, signs, spaces inside, unknown units.
    [
        "",
        "m",
        "15 minutes",
        "1x",
        "-5m",
        "5m3",
        "30m1h",
        "1h1h",
        "1.5h",
        "45",
        "1h 30m",
        "1ms1s",
        "5M",
    ],
)
def test_parse_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(bad)


def test_parse_says_why_the_order_is_wrong() -> None:
    with pytest.raises(ValueError, match="'h' comes after a smaller unit"):
        parse_duration("30m1h")
    with pytest.raises(ValueError, match="'h' is repeated"):
        parse_duration("1h1h")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("2.5", 2.5), (".5", 0.5), ("1e3", 1000), ("10s", 10), ("1h30m", 5400), ("0", 0)],
)
def test_param_takes_float_seconds_or_duration(text: str, seconds: float) -> None:
    assert parse_duration_param(text) == seconds


@pytest.mark.parametrize("bad", ["", "-1", "nan", "inf", "1.5h", "30m1h", "ten"])
def test_param_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration_param(bad)
