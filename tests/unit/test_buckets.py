"""Minute, hour and day buckets agree with the epoch grid, for aware and naive UTC times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from service.core.buckets import (
    DAY,
    HOUR,
    MINUTE,
    ceil_day,
    ceil_minute,
    ceil_to,
    floor_day,
    floor_hour,
    floor_minute,
    floor_to,
)

TIMES = st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2030, 1, 1))
STEPS = st.sampled_from([MINUTE, timedelta(minutes=5), HOUR, DAY])


@given(TIMES, STEPS)
def test_floor_and_ceil_bracket_the_time_on_the_epoch_grid(
    naive: datetime, step: timedelta
) -> None:
    ts = naive.replace(tzinfo=UTC)
    lo, hi = floor_to(ts, step), ceil_to(ts, step)
    assert lo <= ts <= hi and hi - lo in (timedelta(0), step)
    assert lo.timestamp() % step.total_seconds() == 0
    assert (hi == lo) == (ts == lo)
    assert floor_to(naive, step) == lo.replace(tzinfo=None)  # naive times are read as UTC


@given(TIMES)
def test_named_buckets_match_the_general_ones(naive: datetime) -> None:
    ts = naive.replace(tzinfo=UTC)
    assert floor_minute(ts) == floor_to(ts, MINUTE)
    assert ceil_minute(ts) == ceil_to(ts, MINUTE)
    assert floor_hour(ts) == floor_to(ts, HOUR)
    assert floor_day(ts) == floor_to(ts, DAY)
    assert ceil_day(ts) == ceil_to(ts, DAY)


def test_a_day_is_the_utc_day_of_a_time_given_in_another_zone() -> None:
    east = datetime(2026, 3, 2, 1, 30, tzinfo=UTC).astimezone(tz=None)
    assert floor_day(east) == datetime(2026, 3, 2, tzinfo=UTC)
    assert ceil_day(datetime(2026, 3, 2, tzinfo=UTC)) == datetime(2026, 3, 2, tzinfo=UTC)
    assert ceil_minute(datetime(2026, 3, 2, 0, 0, 0, 1, tzinfo=UTC)) == datetime(
        2026, 3, 2, 0, 1, tzinfo=UTC
    )
