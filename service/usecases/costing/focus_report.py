"""The cost report of each UTC day of a window, for the FOCUS export (``service.costs.focus``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection

from service.costs.focus import ReportDay
from service.errors import ValidationFailed
from service.settings import Settings
from service.usecases.costing.cost_report import ReportRequest, check_range, cost_report

# A FOCUS charge is a resource's cost over a period: a job or a GPU, not a team or a node.
FOCUS_GROUP_BYS = ("job", "gpu")
# Each day is one cost report: a longer export is asked for a quarter (or month) at a time.
MAX_DAYS = 92


def day_bounds(start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
    """[start, end) cut at UTC midnights."""
    out = []
    at = start
    while at < end:
        midnight = datetime(at.year, at.month, at.day, tzinfo=UTC) + timedelta(days=1)
        out.append((at, min(midnight, end)))
        at = midnight
    return out


def report_days(
    conn: Connection,
    *,
    settings: Settings,
    request: ReportRequest,
) -> list[ReportDay]:
    """The cost report's rows (every one) of each UTC day of the ``request``'s [start, end); a
    day's end is where its report ends (today's sums end a little before now)."""
    r = request
    if r.group_by not in FOCUS_GROUP_BYS:
        raise ValidationFailed("group_by", f"format=focus groups by one of {FOCUS_GROUP_BYS}")
    check_range(settings, start=r.start, end=r.end, now=r.now)  # refuses a time without a zone
    bounds = day_bounds(r.start.astimezone(UTC), r.end.astimezone(UTC))
    if len(bounds) > MAX_DAYS:
        raise ValidationFailed(
            "start", f"format=focus covers at most {MAX_DAYS} UTC days; ask for a month at a time"
        )
    days = []
    for day_start, day_end in bounds:
        data = cost_report(
            conn, settings=settings, start=day_start, end=day_end, now=r.now,
            group_by=r.group_by, user=r.user, team=r.team, scope=r.scope,
        )  # fmt: skip
        # Today ends where its report does, never before the day starts.
        days.append(ReportDay(day_start, max(day_start, min(day_end, data["end"])), data["rows"]))
    return days
