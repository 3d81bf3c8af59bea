"""Minute, hour and day buckets: the one place UTC times are rounded to a rollup's grid.

Every time here is UTC, aware or naive; a bucket is named by its start.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


def floor_to(ts: datetime, step: timedelta) -> datetime:
    """The start of the ``step``-long bucket that holds ``ts`` (``step`` divides a day)."""
    if step >= DAY:
        return floor_day(ts)
    return ts - (ts - ts.replace(hour=0, minute=0, second=0, microsecond=0)) % step


def ceil_to(ts: datetime, step: timedelta) -> datetime:
    """The first ``step`` boundary at or after ``ts`` (``step`` divides a day)."""
    floor = floor_to(ts, step)
    return floor if floor == ts else floor + step


def floor_minute(ts: datetime) -> datetime:
    """``ts`` rounded down to its minute."""
    return ts.replace(second=0, microsecond=0)


def ceil_minute(ts: datetime) -> datetime:
    """``ts`` rounded up to a whole minute (itself when it is one)."""
    floor = floor_minute(ts)
    return floor if floor == ts else floor + MINUTE


def floor_hour(ts: datetime) -> datetime:
    """``ts`` rounded down to its hour."""
    return ts.replace(minute=0, second=0, microsecond=0)


def floor_day(ts: datetime) -> datetime:
    """The UTC midnight at or before ``ts``."""
    day = ts.astimezone(UTC) if ts.tzinfo is not None else ts
    return day.replace(hour=0, minute=0, second=0, microsecond=0)


def ceil_day(ts: datetime) -> datetime:
    """The UTC midnight at or after ``ts``."""
    floor = floor_day(ts)
    return floor if floor == ts else floor + DAY
