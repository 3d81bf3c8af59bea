"""Times and durations as people write them in queries and on the command line.

Pure: text (and ``now``) in, an aware UTC datetime or seconds out; ValueError names the forms
accepted. The REST API and the CLI both read ``start``, ``end``, ``since`` and ``step`` here, so
a time means the same thing in both.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from service.core.durations import parse_duration, parse_duration_param
from service.errors import ValidationFailed

INSTANT_FORMS = (
    "an RFC 3339 time with a zone (2026-12-01T08:00:00Z), a date (2026-12-01, its midnight "
    "UTC), now, today (its midnight UTC), a time relative to now (-1h, now-30m) or to today "
    "(today-6d) or Unix seconds"
)
# Times outside this range cannot be stored or shifted by a default span without overflowing
# Python's datetime; no telemetry is that old or that far ahead.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_NUMBER = re.compile(r"\d+(\.\d+)?")


def within_range(moment: datetime) -> datetime:
    """``moment`` when it lies within EARLIEST..LATEST (naive read as UTC), else ValueError."""
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    if not EARLIEST <= aware <= LATEST:
        first, last = EARLIEST.date().isoformat(), LATEST.date().isoformat()
        raise ValueError(f"must be between {first} and {last}")
    return moment


def parse_instant(text: str, *, now: datetime) -> datetime:
    """The moment ``text`` names, in UTC (see INSTANT_FORMS); ValueError says what is accepted."""
    try:
        moment = _instant(text, now=now)
    except OverflowError:
        moment = LATEST + timedelta(days=1)
    if not EARLIEST <= moment <= LATEST:
        first, last = EARLIEST.date().isoformat(), LATEST.date().isoformat()
        raise ValueError(f"{text!r} must be between {first} and {last}")
    return moment


def _instant(text: str, *, now: datetime) -> datetime:
    value = text.strip()
    lowered = value.lower()
    midnight = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if lowered == "now":
        return now
    if lowered == "today":
        return midnight
    # Relative to midnight, "last 7 days" can be whole days: today-6d to now.
    if lowered.startswith("today"):
        base, relative = midnight, lowered.removeprefix("today")
    else:
        base, relative = now, lowered.removeprefix("now")
    if relative[:1] in ("-", "+"):
        sign = -1 if relative[0] == "-" else 1
        try:
            seconds = parse_duration(relative[1:])
        except ValueError:
            raise ValueError(f"{text!r} is not {INSTANT_FORMS}") from None
        return base + sign * timedelta(seconds=seconds)
    if _DATE.fullmatch(value):
        try:
            return datetime.fromisoformat(value).replace(tzinfo=UTC)
        except ValueError:
            raise ValueError(f"{text!r} is not a calendar date") from None
    if _NUMBER.fullmatch(value):
        try:
            return datetime.fromtimestamp(float(value), tz=UTC)
        except (ValueError, OSError):
            raise OverflowError(value) from None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        hint = ""
        try:
            parse_duration(value)
            hint = f" (for {value} ago write -{value})"
        except ValueError:
            pass
        raise ValueError(f"{text!r} is not {INSTANT_FORMS}{hint}") from None
    if parsed.tzinfo is None:
        raise ValueError(
            f"{text!r} has no timezone; add Z (UTC) or an offset like +02:00, or give a date alone"
        )
    return parsed.astimezone(UTC)


def parse_seconds(text: str) -> float:
    """Seconds in ``text``: a Prometheus duration (10s, 1h30m) or a number of seconds; > 0."""
    seconds = parse_duration_param(text)
    if seconds <= 0:
        raise ValueError(f"{text!r} must be longer than 0s")
    return seconds


def time_range(
    *,
    start: str | None,
    end: str | None,
    since: str | None,
    now: datetime,
    default_seconds: float,
) -> tuple[datetime, datetime]:
    """[start, end) from the texts given: ``end`` defaults to now, ``start`` to ``end - since``
    (``since`` a duration) or ``end - default_seconds``; ValidationFailed names the parameter."""
    try:
        end_at = parse_instant(end, now=now) if end is not None else now
    except ValueError as exc:
        raise ValidationFailed("end", str(exc)) from None
    if start is not None and since is not None:
        raise ValidationFailed("since", "give start or since, not both")
    if start is not None:
        try:
            start_at = parse_instant(start, now=now)
        except ValueError as exc:
            raise ValidationFailed("start", str(exc)) from None
    else:
        try:
            span = parse_seconds(since) if since is not None else default_seconds
        except ValueError as exc:
            raise ValidationFailed("since", str(exc)) from None
        try:
            start_at = end_at - timedelta(seconds=span)
        except OverflowError:
            start_at = EARLIEST
        start_at = max(start_at, EARLIEST)
    if start_at >= end_at:
        raise ValidationFailed(
            "start", f"{start_at.isoformat()} is not before end {end_at.isoformat()}"
        )
    return start_at, end_at
