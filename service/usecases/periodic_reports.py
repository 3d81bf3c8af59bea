"""The periodic reports round: once a period has ended, every user's, team's and the admins'
report is computed from the cost report, rendered once and queued in the outbox, in the
transaction that claims (period, recipient), so each goes out once on any number of replicas.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from service.context import ServiceContext
from service.costs.periodic import (
    PERIOD_SECONDS,
    Period,
    PeriodData,
    Report,
    build_reports,
    last_ended,
    period_name,
)
from service.costs.report_render import render
from service.db import outbox_repo, policies_repo, reports_repo
from service.db.leader import LeaderLock
from service.errors import NotFound, ValidationFailed
from service.settings import Settings
from service.usecases.cost_report import cost_report

log = logging.getLogger(__name__)


def current_period(settings: Settings, now: datetime) -> Period | None:
    """The latest period whose reports are due at ``now``; None when reports are off."""
    if settings.report_period == "off":
        return None
    length = settings.report_period_seconds or PERIOD_SECONDS[settings.report_period]
    name = period_name(settings.report_period, settings.report_period_seconds)
    return last_ended(
        now, length_seconds=length, delay_seconds=settings.report_delay_seconds, name=name
    )


def period_data(
    conn: Connection, *, settings: Settings, period: Period, now: datetime, jobs: bool = True
) -> PeriodData:
    """The period's cost reports by user, team, node (and job): the very figures of
    ``GET /api/v1/reports/cost`` over the same window."""

    def report(group_by: str) -> dict[str, Any]:
        return cost_report(
            conn, settings=settings, start=period.start, end=period.end, now=now,
            group_by=group_by,
        )  # fmt: skip

    return PeriodData(
        by_user=report("user"),
        by_team=report("team"),
        by_node=report("node"),
        by_job=report("job") if jobs else None,
    )


def reports_of(
    conn: Connection, *, settings: Settings, period: Period, now: datetime
) -> list[Report]:
    """Every report of ``period``: users and teams with jobs in it or the one before, admins."""
    current = period_data(conn, settings=settings, period=period, now=now)
    try:
        before = period_data(conn, settings=settings, period=period.before(), now=now, jobs=False)
    except ValidationFailed:  # the period before is past retention: nothing to compare with
        before = PeriodData(*({"rows": [], "totals": _EMPTY_TOTALS},) * 3)
    return build_reports(
        period, current, before, base_url=settings.public_url,
        top_jobs=settings.report_top_jobs, worst=settings.report_worst,
    )  # fmt: skip


_EMPTY_TOTALS: dict[str, Any] = {
    "held_seconds": 0.0, "cost_usd": 0.0, "waste_usd": 0.0, "idle_usd": 0.0,
    "fixable_usd": 0.0, "jobs": 0, "causes": {},
}  # fmt: skip


def figures_json(report: Report) -> dict[str, Any]:
    """The report's figures as JSON (times in ISO 8601), as the webhook and API carry them."""
    doc: dict[str, Any] = json.loads(json.dumps(asdict(report), default=_iso))
    doc["recipient"] = report.recipient
    return doc


def _iso(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(type(value).__name__)


def message(report: Report, delivery_id: str) -> dict[str, Any]:
    """The outbox payload of one report to one channel, rendered in every form."""
    r = render(report)
    return {
        "kind": "report",
        "delivery_id": delivery_id,
        "recipient": report.recipient,
        "period": report.period.name,
        "period_start": report.period.start.isoformat(),
        "period_end": report.period.end.isoformat(),
        "subject": r.subject,
        "text": r.text,
        "html": r.html,
        "slack": r.slack,
        "figures": figures_json(report),
        "page_url": report.page_url,
    }


def channel_names(settings: Settings) -> list[str]:
    """The channels every report goes to (``GPUWARDEN_REPORT_CHANNELS``)."""
    return [n.strip() for n in settings.report_channels.split(",") if n.strip()]


@dataclass
class ReportRound:
    """What one round did: the period it handled (None: none due or already handled) and each
    recipient's outcome."""

    period: Period | None = None
    outcomes: dict[str, str] = field(default_factory=dict)
    deliveries: int = 0


def reports_once(ctx: ServiceContext) -> ReportRound:
    """Queue the reports of the period just ended unless some replica already did."""
    s, now = ctx.settings, ctx.clock()
    period = current_period(s, now)
    wanted = channel_names(s)
    if period is None or not wanted:
        return ReportRound()
    with ctx.engine.connect() as conn:
        if reports_repo.period_claimed(conn, period_start=period.start):
            return ReportRound()
        known = {c.name for c in policies_repo.list_channels(conn)}
        opted_out = reports_repo.opted_out(conn)
    # A whole past period's figures: the read replica serves them when configured and fresh.
    with ctx.reads.connect() as conn:
        reports = reports_of(conn, settings=s, period=period, now=now)
    channels = [n for n in wanted if n in known]
    for name in sorted(set(wanted) - known):
        log.warning("report channel %r does not exist: its reports are not sent", name)
    return _claim_and_queue(ctx, period, reports, channels, opted_out, now)


def _claim_and_queue(
    ctx: ServiceContext,
    period: Period,
    reports: list[Report],
    channels: list[str],
    opted_out: set[str],
    now: datetime,
) -> ReportRound:
    result = ReportRound(period)
    with ctx.engine.begin() as conn:
        # The period's marker first: a second replica's claim waits here for this transaction,
        # then finds the marker and queues nothing.
        if not reports_repo.claim(
            conn, period_start=period.start, period_end=period.end,
            recipient=reports_repo.PERIOD_MARKER, status="queued", delivery_ids=[], now=now,
        ):  # fmt: skip
            return ReportRound()
        rows: list[dict[str, Any]] = []
        for report in reports:
            status = _status(ctx.settings, report, opted_out)
            to = channels if status == "queued" else []
            ids = [f"rep_{uuid.uuid4().hex}" for _ in to]
            if not reports_repo.claim(
                conn, period_start=period.start, period_end=period.end,
                recipient=report.recipient, status=status, delivery_ids=ids, now=now,
            ):  # fmt: skip
                continue
            result.outcomes[report.recipient] = status
            rows += [
                {"delivery_id": i, "channel": ch, "alert_id": None, "payload": message(report, i)}
                for i, ch in zip(ids, to, strict=True)
            ]
        outbox_repo.enqueue(conn, rows, now=now)
    result.deliveries = len(rows)
    for status in result.outcomes.values():
        ctx.telemetry.reports.labels(status).inc()
    log.info("queued the %s reports of %s: %d deliveries", period.name, period.label(), len(rows))
    return result


def _status(settings: Settings, report: Report, opted_out: set[str]) -> str:
    """queued, opted_out, or no_jobs (a quiet user or team when those are skipped)."""
    if report.recipient in opted_out:
        return "opted_out"
    if report.totals is None and settings.report_no_jobs == "skip":
        return "no_jobs"
    return "queued"


class ReportScheduler:
    """The reports round on the leader replica only (the evaluator's lock)."""

    def __init__(self, ctx: ServiceContext, leader: LeaderLock) -> None:
        self.ctx = ctx
        self.leader = leader

    def tick(self) -> ReportRound:
        """If this replica is the leader: queue the reports of a period just ended."""
        if not self.leader.check():
            return ReportRound()
        return reports_once(self.ctx)


def preview(
    conn: Connection, *, settings: Settings, recipient: str, at: datetime, now: datetime
) -> dict[str, Any]:
    """``recipient``'s report of the last period due at ``at`` (a past period, or the one just
    ended), rendered as it is sent; NotFound when that recipient has none in it."""
    name = settings.report_period if settings.report_period != "off" else "weekly"
    length = settings.report_period_seconds or PERIOD_SECONDS[name]
    period = last_ended(
        min(at, now), length_seconds=length, delay_seconds=0.0,
        name=period_name(name, settings.report_period_seconds),
    )  # fmt: skip
    for report in reports_of(conn, settings=settings, period=period, now=now):
        if report.recipient == recipient:
            r = render(report)
            return {
                "recipient": recipient, "period_start": period.start, "period_end": period.end,
                "subject": r.subject, "text": r.text, "html": r.html,
                "figures": figures_json(report),
            }  # fmt: skip
    raise NotFound(f"{recipient} ran no job in {period.label()} or the period before")
