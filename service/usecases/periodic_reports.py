"""The periodic reports round: once a period has ended, every user's, team's and the admins'
report is computed from the cost report, rendered once and queued in the outbox, in the
transaction that claims (period, recipient), so each goes out once on any number of replicas.
"""

from __future__ import annotations

import html
import json
import logging
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, TypedDict, assert_never

from sqlalchemy import Connection

from service.context import ServiceContext
from service.core import unsubscribe
from service.core.slack_text import TEXT_MAX
from service.costs.periodic import (
    PERIOD_SECONDS,
    Period,
    PeriodData,
    Report,
    build_reports,
    last_ended,
    period_name,
)
from service.costs.report_render import Rendered, render
from service.db import outbox_repo, policies_repo, reports_repo, secrets_repo
from service.db.leader import LeaderLock
from service.db.rows import NewOutboxRow
from service.errors import Conflict, NotFound, ValidationFailed
from service.notify.envelope import Message
from service.settings import Settings
from service.thresholds.owners import ADMINS, Addressee
from service.usecases import notices
from service.usecases.costing.cost_report import cost_report
from service.usecases.savings_columns import add_savings

log = logging.getLogger(__name__)

# The service secret that signs the reports' one-click unsubscribe links.
UNSUBSCRIBE_KEY = "report-unsubscribe"


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

    by_user, by_team, by_node = report("user"), report("team"), report("node")
    for data in (by_user, by_team):
        add_savings(conn, data, start=period.start, end=period.end)
    # The fleet's totals (the admins') carry the fleet's savings: every team's.
    by_node["totals"] = {
        **by_node["totals"],
        "realised_usd": by_team["totals"]["realised_usd"],
        "promised_usd": by_team["totals"]["promised_usd"],
    }
    return PeriodData(
        by_user=by_user,
        by_team=by_team,
        by_node=by_node,
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


def message(report: Report, rendered: Rendered, delivery_id: str) -> dict[str, Any]:
    """The outbox payload of one report to one channel, in every form it was rendered in."""
    r = rendered
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


def people_message(rendered: Rendered, unsubscribe_url: str | None = None) -> Message:
    """The report as a message for a person's e-mail or Slack DM (the same rendering), with
    the link that stops it at the end."""
    text, body = rendered.text, rendered.html
    if unsubscribe_url is not None:
        text += f"\nStop these reports: {unsubscribe_url}\n"
        body = body.replace("</div></body>", f"{_footer(unsubscribe_url)}</div></body>", 1)
    return Message(
        subject=rendered.subject[:998],
        text=text,
        html=body,
        slack_text=rendered.slack["text"][:TEXT_MAX],
        slack_blocks=rendered.slack["blocks"],
        unsubscribe_url=unsubscribe_url,
    )


def _footer(url: str) -> str:
    """The HTML line with the link that stops the report."""
    href = html.escape(url, quote=True)
    return (
        "<p style='margin:16px 0 0;font-size:12px;color:#667085'>"
        f"<a href='{href}'>Stop these reports</a> (one click; an admin can start them again)</p>"
    )


def stop_by_link(conn: Connection, ctx: ServiceContext, *, recipient: str, sig: str) -> bool:
    """Stop ``recipient``'s report if ``sig`` is the service's signature of it (its one-click
    link); False, and nothing changed, otherwise."""
    key = secrets_repo.get_or_create(conn, name=UNSUBSCRIBE_KEY, now=ctx.clock())
    if not unsubscribe.is_valid(key, recipient, sig):
        return False
    reports_repo.opt_out(conn, recipient=recipient, by="one-click link", now=ctx.clock())
    return True


def link_is_valid(conn: Connection, ctx: ServiceContext, *, recipient: str, sig: str) -> bool:
    """Whether ``sig`` signs ``recipient`` (the page before the click: it changes nothing)."""
    key = secrets_repo.get_or_create(conn, name=UNSUBSCRIBE_KEY, now=ctx.clock())
    return unsubscribe.is_valid(key, recipient, sig)


def unsubscribe_url(conn: Connection, ctx: ServiceContext, recipient: str) -> str | None:
    """The one-click link that stops ``recipient``'s report (None for the admins')."""
    key = secrets_repo.get_or_create(conn, name=UNSUBSCRIBE_KEY, now=ctx.clock())
    return unsubscribe.link(ctx.settings.public_url, key, recipient)


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


PEOPLE_CHANNEL_TYPES = ("email", "slack_dm")  # channels that reach a person's own address


def reports_once(ctx: ServiceContext) -> ReportRound:
    """Queue the reports of the period just ended unless some replica already did."""
    s, now = ctx.settings, ctx.clock()
    period = current_period(s, now)
    if period is None:
        return ReportRound()
    wanted = channel_names(s)
    with ctx.engine.connect() as conn:
        chans = policies_repo.list_channels(conn)
        to_people = s.report_to_owners and any(c.type in PEOPLE_CHANNEL_TYPES for c in chans)
        if not (wanted or to_people):
            return ReportRound()
        if reports_repo.period_claimed(conn, period_start=period.start):
            return ReportRound()
        opted_out = reports_repo.opted_out(conn)
    # A whole past period's figures: on the primary, since days not summed yet are read from
    # finer data through temporary tables, which a hot standby cannot create.
    with ctx.reads.connect(costs=True) as conn:
        reports = reports_of(conn, settings=s, period=period, now=now)
    known = {c.name for c in chans}
    channels = [n for n in wanted if n in known]
    for name in sorted(set(wanted) - known):
        log.warning("report channel %r does not exist: its reports are not sent", name)
    sending = [r for r in reports if _status(s, r, opted_out) == "queued"]
    people = addressees(ctx, sending) if to_people else {}
    return _claim_and_queue(ctx, period, reports, channels, opted_out, people, now)


def addressees(ctx: ServiceContext, reports: list[Report]) -> dict[str, Addressee]:
    """Each report's recipient's own addresses from the owner directory (the lookup command run
    for users missing from it). One without an address gets none: a report never falls back to
    someone else (the team and the admins have their own), and the notice records why."""
    by_user = notices.resolve_many(ctx, [(r.name, None) for r in reports if r.kind == "user"])
    with ctx.engine.connect() as conn:
        admins = notices.directory(conn, users=(), teams=(), now=ctx.clock()).get(ADMINS)
    out = {}
    for r in reports:
        match r.kind:
            case "user":
                found = by_user[(r.name, None)]
            case "team":
                found = notices.resolve_team_addressee(ctx, team=r.name)
            case "admins":
                reachable = admins if admins is not None and admins.reachable else None
                found = Addressee(ADMINS, reachable)
            case _:
                assert_never(r.kind)
        if found.fallback is not None or found.entry is None:
            why = f"{r.kind} {r.name} has no address in the owner directory"
            found = Addressee(r.recipient, None, None, why)
        out[r.recipient] = found
    return out


def _claim_and_queue(
    ctx: ServiceContext,
    period: Period,
    reports: list[Report],
    channels: list[str],
    opted_out: set[str],
    people: dict[str, Addressee],
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
        for report in reports:
            status = _status(ctx.settings, report, opted_out)
            ids = _queue(conn, ctx, report, channels, people, now) if status == "queued" else []
            if not reports_repo.claim(
                conn, period_start=period.start, period_end=period.end,
                recipient=report.recipient, status=status, delivery_ids=ids, now=now,
            ):  # fmt: skip
                # The marker serialises the claims; a taken one undoes this whole transaction.
                raise Conflict(f"the {period.label()} report of {report.recipient} was claimed")
            result.outcomes[report.recipient] = status
            result.deliveries += len(ids)
    for status in result.outcomes.values():
        ctx.telemetry.reports.labels(status).inc()
    log.info(
        "queued the %s reports of %s: %d deliveries", period.name, period.label(), result.deliveries
    )
    return result


def _queue(
    conn: Connection,
    ctx: ServiceContext,
    report: Report,
    channels: list[str],
    people: dict[str, Addressee],
    now: datetime,
) -> list[str]:
    """Queue ``report``, rendered once, to the report channels and to its recipient's own
    addresses; the delivery ids."""
    rendered = render(report)
    ids = [f"rep_{uuid.uuid4().hex}" for _ in channels]
    rows: list[NewOutboxRow] = [
        {"delivery_id": i, "channel": ch, "alert_id": None, "payload": message(report, rendered, i)}
        for i, ch in zip(ids, channels, strict=True)
    ]
    outbox_repo.enqueue(conn, rows, now=now)
    addressee = people.get(report.recipient)
    if addressee is not None:
        key = f"report:{report.period.name}:{report.period.start.isoformat()}:{report.recipient}"
        message_ = people_message(rendered, unsubscribe_url(conn, ctx, report.recipient))
        made = notices.queue_message(
            conn, ctx, addressee=addressee, message=message_, kind="report", key=key
        )
        ids += [str(n["delivery_id"]) for n in made if n["status"] == "pending"]
    return ids


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


class ReportPreview(TypedDict):
    """A report as it is sent: its subject, text and HTML, and its figures (USD, GPU-hours)."""

    recipient: str
    period_start: datetime
    period_end: datetime
    subject: str
    text: str
    html: str
    figures: dict[str, Any]


def preview(
    conn: Connection, *, settings: Settings, recipient: str, at: datetime, now: datetime
) -> ReportPreview:
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
