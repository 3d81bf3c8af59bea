"""Proven savings (issue 46): a job's saving against the earlier run of its work that was told a
fix, and the ledger of realised savings per group and month with the promises beside them and
the per-cause calibration."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from service.context import ServiceContext
from service.core.matching import MatchRules, Run, match_of
from service.core.work_key import JobFacts, work_key_of
from service.costs.recommend import Recommendation
from service.costs.savings import (
    Calibration,
    LedgerPair,
    LedgerRow,
    RunMoney,
    Saving,
    calibrated,
    calibration,
    counts_in_ledger,
    ledger,
    realised,
    was_told_a_fix,
)
from service.db import jobs_repo, savings_repo
from service.db.rows import JobRow
from service.db.savings_repo import StoredRun
from service.errors import ValidationFailed
from service.roles import JobScope
from service.settings import Settings
from service.usecases.job_summary import JobSummary, job_summary

LEDGER_GROUP_BYS = ("team", "user", "project")


def rules_of(settings: Settings) -> MatchRules:
    """The matching rules the settings give."""
    return MatchRules(
        horizon=timedelta(days=settings.savings_horizon_days),
        length_tolerance=settings.savings_length_tolerance,
    )


def run_of(stored: StoredRun) -> Run:
    """A stored job as a run of its work key."""
    job = stored.job
    return Run(
        job_id=job["id"],
        key=work_key_of(JobFacts.of(job, stored.gpu_models)),
        started_at=job["started_at"],
        ended_at=job["ended_at"],
        gpu_seconds=stored.gpu_seconds,
        units=stored.units,
        unit=stored.unit,
    )


def money_of(summary: JobSummary) -> RunMoney:
    """A run's money figures from its summary: held GPU-seconds, cost, waste, cause shares of
    its covered time, and the fixes it was told."""
    row = summary.summary
    covered = float(row["allocated_seconds"] or 0.0)
    shares = {
        name: float(c["seconds"]) / covered if covered > 0 else 0.0
        for name, c in row["causes"].items()
    }
    return RunMoney(
        gpu_seconds=float(row["held_seconds"]),
        cost_usd=row["cost_usd"],
        waste_usd=row["waste_usd"],
        cause_shares=shares,
        fixes=tuple(summary.recommendations),
    )


@dataclass(slots=True)
class _Summaries:
    """Job summaries read once per request (the ledger meets a run as before and after)."""

    settings: Settings
    now: datetime
    cache: dict[str, JobSummary] = field(default_factory=dict)

    def of(self, conn: Connection, job: JobRow) -> JobSummary:
        if job["id"] not in self.cache:
            self.cache[job["id"]] = job_summary(conn, settings=self.settings, job=job, now=self.now)
        return self.cache[job["id"]]


def _saving(
    conn: Connection,
    job: JobRow,
    summaries: _Summaries,
    after: JobSummary | None,
) -> Saving | None:
    """The saving of ``job`` against the earlier run of its key told a fix that it is the first
    unchanged later run of (``matching.match_of``); None where no told run precedes it in the
    horizon."""
    key = job.get("work_key")
    if not key:
        return None
    settings = summaries.settings
    rules = rules_of(settings)
    stored = savings_repo.runs_of_key(
        conn, key=key, start=job["started_at"] - 2 * rules.horizon, end=job["started_at"],
        now=summaries.now,
    )  # fmt: skip
    runs = [run_of(s) for s in stored]
    later = next((r for r in runs if r.job_id == job["id"]), None)
    if later is None:
        return None
    monies: dict[str, RunMoney] = {}

    def told(run: Run) -> float | None:
        """The run's max saving fraction where it was told a fix, else None."""
        row = jobs_repo.get_job(conn, job_id=run.job_id)
        if row is None:
            return None
        money = monies[run.job_id] = money_of(summaries.of(conn, row))
        return money.waste_fraction() if was_told_a_fix(money) else None

    pair = match_of(runs, later, rules, told)
    if pair is None:
        return None
    after_money = money_of(after if after is not None else summaries.of(conn, job))
    return realised(
        pair, monies[pair.before.job_id], after_money, noise_floor=settings.savings_noise_floor
    )


def job_saving(
    conn: Connection,
    *,
    settings: Settings,
    job: JobRow,
    now: datetime,
    summary: JobSummary | None = None,
) -> Saving | None:
    """What ``job`` saved against the earlier run of its work that was told a fix (None where
    there is none); ``summary`` is the job's own, where the caller has it."""
    return _saving(conn, job, _Summaries(settings, now), summary)


def without_applied_fix(summary: JobSummary, saving: Saving | None) -> JobSummary:
    """``summary`` less the fix its run already applies (a fixed run is never told the fix it
    applies): where the saving names the applied fix, its cause's recommendation goes."""
    applied = saving.applied_cause if saving is not None else None
    if applied is None:
        return summary
    kept = [f for f in summary.recommendations if f.cause != applied]
    if len(kept) == len(summary.recommendations):
        return summary
    total = sum(f.saving_usd or 0.0 for f in kept) if summary.savings_usd is not None else None
    return JobSummary(
        summary=summary.summary, per_gpu=summary.per_gpu, energy=summary.energy,
        recommendations=kept, savings_usd=total, faults=summary.faults,
        warnings=summary.warnings,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Ledger:
    """Realised savings per group and month over a window, the pairs behind them and the
    per-cause calibration."""

    start: datetime
    end: datetime
    group_by: str
    rows: list[LedgerRow]
    pairs: list[LedgerPair]
    calibration: list[Calibration]

    def as_dict(self) -> dict[str, Any]:
        """The API's form of the ledger (USD to the cent; totals are the rows' sums)."""
        booked = [p for p in self.pairs if counts_in_ledger(p.saving)]
        return {
            "start": self.start,
            "end": self.end,
            "group_by": self.group_by,
            "rows": [r.as_dict() for r in self.rows],
            "totals": {
                "pairs": sum(r.pairs for r in self.rows),
                "realised_usd": sum(r.realised_cents for r in self.rows) / 100,
                "promised_usd": sum(r.promised_cents for r in self.rows) / 100,
            },
            "pairs": [
                {
                    "job_id": p.job_id,
                    "team": p.team,
                    "user": p.user,
                    "project": p.project,
                    "month": p.month,
                    "booked": p in booked,
                    **p.saving.as_dict(),
                }
                for p in self.pairs
            ],
            "calibration": [c.as_dict() for c in self.calibration],
        }


def savings_ledger(
    conn: Connection,
    *,
    settings: Settings,
    start: datetime,
    end: datetime,
    now: datetime,
    group_by: str = "team",
    scope: JobScope | None = None,
) -> Ledger:
    """Realised and promised savings per ``group_by`` and month of the later runs that ended in
    [start, end), each pair's USD rounded to the cent before it is added; a person sees only
    their own and their teams' jobs."""
    if group_by not in LEDGER_GROUP_BYS:
        raise ValidationFailed("group_by", f"must be one of {', '.join(LEDGER_GROUP_BYS)}")
    if start >= end:
        raise ValidationFailed("start", "must be before end")
    summaries = _Summaries(settings, now)
    pairs: list[LedgerPair] = []
    for job_id, _ in savings_repo.keys_ended_in(conn, start=start, end=end):
        job = jobs_repo.get_job(conn, job_id=job_id)
        if job is None or (
            scope is not None and not scope.allows(job.get("user"), job.get("team"))
        ):
            continue
        saving = _saving(conn, job, summaries, None)
        if saving is None or job["ended_at"] is None:
            continue
        ended = job["ended_at"].astimezone(UTC)
        pairs.append(
            LedgerPair(job_id, job.get("team"), job.get("user"), job.get("project"),
                       f"{ended:%Y-%m}", saving)
        )  # fmt: skip
    return Ledger(
        start=start, end=end, group_by=group_by, rows=ledger(pairs, group_by), pairs=pairs,
        calibration=calibration((p.saving for p in pairs), settings.savings_calibration_min_pairs),
    )  # fmt: skip


def savings_once(ctx: ServiceContext) -> int:
    """Compute and store the savings of the later runs that ended lately (the last
    ``savings_recompute_days``; the whole calibration window the first time), then relearn
    each cause's calibration from the stored ones; returns how many savings it stored."""
    now = ctx.clock()
    s = ctx.settings
    # Read first, outside any write: a long read never holds the store's write lock (SQLite).
    with ctx.engine.connect() as conn:
        days = s.savings_recompute_days
        if savings_repo.stored_count(conn) == 0:
            days = max(days, s.savings_calibration_days)
        found = savings_ledger(conn, settings=s, start=now - timedelta(days=days), end=now, now=now)
        ends = {p.job_id: e for p in found.pairs if (e := _ended(conn, p.job_id)) is not None}
    with ctx.engine.begin() as conn:
        savings_repo.store_savings(
            conn, pairs=[(p, ends[p.job_id]) for p in found.pairs if p.job_id in ends], at=now
        )
        stored = savings_repo.stored_savings(
            conn, since=now - timedelta(days=s.savings_calibration_days)
        )
        savings_repo.replace_calibration(
            conn, rows=calibration(stored, s.savings_calibration_min_pairs), at=now
        )
    return len(found.pairs)


def _ended(conn: Connection, job_id: str) -> datetime | None:
    job = jobs_repo.get_job(conn, job_id=job_id)
    return None if job is None else job["ended_at"]


def calibrated_fixes(
    conn: Connection, recommendations: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The job's fixes (their API form), each with its cause's calibration factor and its
    saving once calibrated (null where the cause has no factor yet)."""
    table = savings_repo.calibration(conn)
    out = []
    for fix, rec in zip(recommendations, _as_fixes(recommendations), strict=True):
        factor, usd = calibrated(rec, table) if rec is not None else (None, None)
        out.append({**fix, "calibration_factor": factor, "calibrated_saving_usd": usd})
    return out


def _as_fixes(recommendations: list[dict[str, Any]]) -> list[Recommendation | None]:
    """The cause fixes among ``recommendations`` (API form) as Recommendations, else None."""
    out: list[Recommendation | None] = []
    for f in recommendations:
        if f.get("kind") != "cause":
            out.append(None)
            continue
        out.append(
            Recommendation(
                kind="cause", cause=f["cause"], action=f["action"], seconds=f["seconds"],
                usd=f["usd"], saving_fraction=f["saving_fraction"], saving_usd=f["saving_usd"],
                assumption=f["assumption"],
            )
        )  # fmt: skip
    return out
