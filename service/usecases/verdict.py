"""What every surface tells a job of itself, so far: its cost, waste, top cause and the fix to
apply (job alerts, owner notices, the ladder's steps and reclaims, Slurm's AdminComment), from
its summary less the fix its run already applies (``savings.without_applied_fix``, the job
page's rule: a fixed run is never told the fix it applies)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection

from service.core.admin_comment import verdict_line
from service.core.verdict import Verdict
from service.db import jobs_repo
from service.db.rows import JobRow
from service.settings import Settings
from service.usecases.job_summary import JobSummary, job_summary
from service.usecases.savings import job_saving, without_applied_fix
from service.vocabulary import job_path


def told_summary(conn: Connection, *, settings: Settings, job: JobRow, now: datetime) -> JobSummary:
    """The job's summary as it is told to the job: less the fix its run already applies."""
    summary = job_summary(conn, settings=settings, job=job, now=now)
    saving = job_saving(conn, settings=settings, job=job, now=now, summary=summary)
    return without_applied_fix(summary, saving)


def job_verdict(
    conn: Connection, *, job_id: str, now: datetime, settings: Settings
) -> Verdict | None:
    """What a job alert says about the job so far: its cost and waste (idle + fixable USD), its
    top cause, the fix to apply and what it saves; None for an unknown job."""
    job = jobs_repo.get_job(conn, job_id=job_id)
    if job is None:
        return None
    return verdict_of(told_summary(conn, settings=settings, job=job, now=now))


def verdict_of(summary: JobSummary) -> Verdict:
    """The verdict of a job's ``summary``: the top cause's fix where it is among the fixes, else
    the largest one left."""
    row = summary.summary
    cause = row["top_cause"]
    fixes = summary.recommendations
    fix = next((f for f in fixes if cause and f.cause == cause), fixes[0] if fixes else None)
    return Verdict(
        cost_usd=row["cost_usd"],
        waste_usd=row["waste_usd"],
        idle_usd=row["idle_usd"],
        fixable_usd=row["fixable_usd"],
        top_cause=cause,
        fix=fix.action if fix else None,
        fix_saving_usd=fix.saving_usd if fix else None,
    )


def admin_comment(conn: Connection, *, job: JobRow, now: datetime, settings: Settings) -> str:
    """The job's verdict so far as one short ASCII line for Slurm's AdminComment, with the same
    cost, waste, top cause and fix as its page and job alerts, and a link to its page."""
    summary = told_summary(conn, settings=settings, job=job, now=now)
    verdict = verdict_of(summary)
    return verdict_line(
        cost_usd=verdict.cost_usd,
        held_seconds=summary.summary["held_seconds"],
        waste_usd=verdict.waste_usd,
        top_cause=verdict.top_cause,
        fix=verdict.fix,
        link=settings.public_url.rstrip("/") + job_path(job["id"]),
    )
