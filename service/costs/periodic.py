"""The periodic reports' figures: which period has just ended, and per user, per team and for
the admins what it cost (USD), how much was waste (idle + fixable, by cause), the costliest
jobs with their fix, and the change since the period before.

Pure: the cost reports of the period (one per grouping, as ``GET /api/v1/reports/cost``
returns them) and ``now`` in, figures out. Every dollar is a figure of those reports, never
recomputed, so a mail and the API say the same to the cent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from service.vocabulary import job_path, owner_page_path

ReportKind = Literal["user", "team", "admins"]
PeriodName = Literal["weekly", "daily"]
PERIOD_SECONDS: dict[str, float] = {"weekly": 7 * 86400.0, "daily": 86400.0}
# Periods are counted from a Monday midnight UTC, so a week runs Monday to Monday.
PERIOD_ANCHOR = datetime(1970, 1, 5, tzinfo=UTC)
UNKNOWN_OWNER = "__unknown__"  # the cost report's key for jobs without a user or team
UNALLOCATED = "__unallocated__"  # its key for GPU time no job held
_NOBODY = (UNKNOWN_OWNER, UNALLOCATED)
ADMINS = "admins"


@dataclass(frozen=True, slots=True)
class Period:
    """A report's period [start, end) (UTC) and its name (weekly, daily, or its length)."""

    start: datetime
    end: datetime
    name: str

    def label(self) -> str:
        """The period in words, e.g. "week of 2026-11-23", "2026-11-30" or a range."""
        if self.name == "weekly":
            return f"week of {self.start.date().isoformat()}"
        if self.name == "daily":
            return self.start.date().isoformat()
        return f"{_iso(self.start)} to {_iso(self.end)}"

    def before(self) -> Period:
        """The period of the same length just before this one."""
        length = self.end - self.start
        return Period(self.start - length, self.start, self.name)


def _iso(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def period_name(name: str, length_seconds: float | None) -> str:
    """The period's name: ``name`` unless a custom length overrides it (then "<n>s")."""
    return f"{length_seconds:g}s" if length_seconds else name


def last_ended(now: datetime, *, length_seconds: float, delay_seconds: float, name: str) -> Period:
    """The latest period of ``length_seconds`` that ended at least ``delay_seconds`` before
    ``now`` (the delay lets late batches and rollups land before the figures are taken)."""
    length = timedelta(seconds=length_seconds)
    since = now - timedelta(seconds=delay_seconds) - PERIOD_ANCHOR
    end = PERIOD_ANCHOR + length * (since // length)
    return Period(end - length, end, name)


@dataclass(frozen=True, slots=True)
class Totals:
    """A group's figures over a period: GPU-hours, cost, waste = idle + fixable (USD), the
    waste of each cause that had some, and how many jobs."""

    gpu_hours: float
    cost_usd: float | None
    waste_usd: float | None
    idle_usd: float | None
    fixable_usd: float | None
    jobs: int
    waste_by_cause_usd: dict[str, float] = field(default_factory=dict)
    # The waste in GPU-hours (the same model): the figure of a site without prices.
    waste_gpu_hours: float = 0.0
    idle_gpu_hours: float = 0.0
    fixable_gpu_hours: float = 0.0
    # Proven savings (docs/savings.md): the fixes applied by runs that ended in the period,
    # realised and promised (USD); None where the report has no such figure.
    realised_usd: float | None = None
    promised_usd: float | None = None

    @classmethod
    def of_row(cls, row: Mapping[str, Any]) -> Totals:
        """The totals of one cost-report row (or its totals row)."""
        causes = row.get("causes") or {}
        by_cause = {
            name: float(c["waste_usd"])
            for name, c in causes.items()
            if c.get("waste_usd") is not None and float(c["waste_usd"]) > 0
        }
        return cls(
            gpu_hours=float(row["held_seconds"]) / 3600.0,
            cost_usd=row["cost_usd"],
            waste_usd=row["waste_usd"],
            idle_usd=row["idle_usd"],
            fixable_usd=row["fixable_usd"],
            jobs=int(row["jobs"]),
            waste_by_cause_usd=dict(sorted(by_cause.items(), key=lambda kv: -kv[1])),
            waste_gpu_hours=float(row.get("waste_gpu_hours") or 0.0),
            idle_gpu_hours=float(row.get("idle_gpu_hours") or 0.0),
            fixable_gpu_hours=float(row.get("fixable_gpu_hours") or 0.0),
            realised_usd=row.get("realised_usd"),
            promised_usd=row.get("promised_usd"),
        )


@dataclass(frozen=True, slots=True)
class JobLine:
    """One of the costliest jobs: its owner, GPU-hours, cost and waste (USD), top cause, and
    the fix that saves most with its saving (USD)."""

    job_id: str
    user: str | None
    team: str | None
    gpu_hours: float
    cost_usd: float | None
    waste_usd: float | None
    top_cause: str | None
    fix: str | None
    fix_saving_usd: float | None
    url: str
    waste_gpu_hours: float = 0.0


@dataclass(frozen=True, slots=True)
class Ranked:
    """A user or team in the admins' list of the worst: waste and cost (USD), top cause."""

    name: str
    waste_usd: float | None
    cost_usd: float | None
    top_cause: str | None
    url: str
    waste_gpu_hours: float = 0.0


@dataclass(frozen=True, slots=True)
class Report:
    """One recipient's report of one period; ``totals`` None when it ran no job in it."""

    kind: ReportKind
    name: str
    period: Period
    totals: Totals | None
    previous: Totals | None
    top_jobs: list[JobLine]
    page_url: str
    worst_users: list[Ranked] = field(default_factory=list)
    worst_teams: list[Ranked] = field(default_factory=list)

    @property
    def recipient(self) -> str:
        """The recipient's key: "user:<name>", "team:<name>" or "admins"."""
        return ADMINS if self.kind == "admins" else f"{self.kind}:{self.name}"


@dataclass(frozen=True, slots=True)
class PeriodData:
    """The cost reports of one period, grouped by user, by team, by job and by node (the
    last for the fleet totals, unallocated time included); previous periods need no jobs."""

    by_user: Mapping[str, Any]
    by_team: Mapping[str, Any]
    by_node: Mapping[str, Any]
    by_job: Mapping[str, Any] | None = None


def _rows(report: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(r["key"]): r for r in report["rows"] if r["key"] not in _NOBODY}


def _fix(row: Mapping[str, Any]) -> tuple[str | None, float | None]:
    fixes = row.get("fixes") or []
    if not fixes:
        return None, None
    return fixes[0].get("action"), fixes[0].get("saving_usd")


def costliest_jobs(
    job_rows: Sequence[Mapping[str, Any]], *, base_url: str, n: int
) -> list[JobLine]:
    """The ``n`` jobs of ``job_rows`` that cost most (unpriced last), each with its top fix."""
    priced = sorted(
        (r for r in job_rows if r["key"] != UNALLOCATED),
        # Unpriced last, by GPU-hours (a site without prices ranks by them alone).
        key=lambda r: (
            r["cost_usd"] is None,
            -(r["cost_usd"] or 0.0),
            -float(r["held_seconds"]),
            str(r["key"]),
        ),
    )
    out = []
    for r in priced[:n]:
        fix, saving = _fix(r)
        out.append(
            JobLine(
                job_id=str(r["key"]), user=r.get("user"), team=r.get("team"),
                gpu_hours=float(r["held_seconds"]) / 3600.0, cost_usd=r["cost_usd"],
                waste_usd=r["waste_usd"], top_cause=r.get("top_cause"), fix=fix,
                fix_saving_usd=saving, url=base_url + job_path(str(r["key"])),
                waste_gpu_hours=float(r.get("waste_gpu_hours") or 0.0),
            )
        )  # fmt: skip
    return out


def page_url(base_url: str, kind: str, name: str, period: Period) -> str:
    """The console page of a user or team showing ``period`` (the admins': the costs page)."""
    window = f"start={_iso(period.start)}&end={_iso(period.end)}"
    if kind == "admins":
        return f"{base_url}/costs?group_by=team&{window}"
    return f"{base_url}{owner_page_path(kind, name)}?{window}"


def build_reports(
    period: Period,
    current: PeriodData,
    previous: PeriodData,
    *,
    base_url: str,
    top_jobs: int = 3,
    worst: int = 5,
) -> list[Report]:
    """Every report of ``period``: one per user and team that ran a job in it or in the period
    before (a quiet week is news too), then the admins' one."""
    base = base_url.rstrip("/")
    job_rows = list((current.by_job or {"rows": []})["rows"])
    out: list[Report] = []
    for kind, cur, prev in (
        ("user", current.by_user, previous.by_user),
        ("team", current.by_team, previous.by_team),
    ):
        now_rows, before_rows = _rows(cur), _rows(prev)
        for name in sorted(set(now_rows) | set(before_rows)):
            row, old = now_rows.get(name), before_rows.get(name)
            mine = [r for r in job_rows if r.get(kind) == name]
            out.append(
                Report(
                    kind="user" if kind == "user" else "team", name=name, period=period,
                    totals=Totals.of_row(row) if row else None,
                    previous=Totals.of_row(old) if old else None,
                    top_jobs=costliest_jobs(mine, base_url=base, n=top_jobs),
                    page_url=page_url(base, kind, name, period),
                )
            )  # fmt: skip
    out.append(admins_report(period, current, previous, base=base, top_jobs=top_jobs, worst=worst))
    return out


def admins_report(
    period: Period, current: PeriodData, previous: PeriodData, *, base: str, top_jobs: int,
    worst: int,
) -> Report:  # fmt: skip
    """The admins' report: the fleet's totals, its costliest jobs, the worst users and teams."""

    def ranked(report: Mapping[str, Any], kind: str) -> list[Ranked]:
        rows = [r for r in report["rows"] if r["key"] not in _NOBODY]
        rows.sort(
            key=lambda r: (
                r["waste_usd"] is None,
                -(r["waste_usd"] or 0.0),
                -float(r.get("waste_gpu_hours") or 0.0),
                str(r["key"]),
            )
        )
        return [
            Ranked(str(r["key"]), r["waste_usd"], r["cost_usd"], r.get("top_cause"),
                   page_url(base, kind, str(r["key"]), period),
                   float(r.get("waste_gpu_hours") or 0.0))
            for r in rows[:worst]
        ]  # fmt: skip

    fleet = current.by_node["totals"]
    return Report(
        kind="admins", name=ADMINS, period=period,
        # A fleet that held no GPU in the period (none had reported yet) ran nothing in it.
        totals=Totals.of_row(fleet) if float(fleet["held_seconds"]) > 0 else None,
        previous=Totals.of_row(previous.by_node["totals"]),
        top_jobs=costliest_jobs(
            list((current.by_job or {"rows": []})["rows"]), base_url=base, n=top_jobs
        ),
        page_url=page_url(base, "admins", ADMINS, period),
        worst_users=ranked(current.by_user, "user"),
        worst_teams=ranked(current.by_team, "team"),
    )  # fmt: skip


def change(now: float | None, before: float | None) -> str:
    """The change from ``before`` to ``now`` (USD) in words: "+$1.20 (+15%)", "no change",
    "new" (nothing before) or "n/a" (either unpriced)."""
    if now is None or before is None:
        return "n/a"
    delta = now - before
    if abs(delta) < 0.005:
        return "no change"
    sign = "+" if delta > 0 else "-"
    text = f"{sign}${abs(delta):,.2f}"
    if before >= 0.005:
        text += f" ({sign}{abs(delta) / before:.0%})"
    return text
