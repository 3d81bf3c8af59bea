"""A job's progress (issue 46): record a reading under the monotonic rule, and read them back
with their summary."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection

from service.core.progress import (
    ProgressSummary,
    Reading,
    UnitOfWork,
    check_next,
    is_repeat,
    summarize,
    unit_of_work,
)
from service.db import progress_repo
from service.errors import ValidationFailed


@dataclass(frozen=True, slots=True)
class JobProgress:
    """A job's readings in time order and their summary (None when it reported none)."""

    readings: list[Reading]
    summary: ProgressSummary | None


def record(
    conn: Connection,
    *,
    job_id: str,
    job_started_at: datetime,
    reading: Reading,
    now: datetime,
    max_future_seconds: float,
) -> bool:
    """Store ``reading`` for ``job_id`` unless it repeats the last one (a retry); True when
    stored. Raises ValidationFailed (``at`` out of the job's time) or Conflict (the rule of
    core/progress.py)."""
    if reading.at > now + timedelta(seconds=max_future_seconds):
        raise ValidationFailed("at", f"{reading.at.isoformat()} lies in the future")
    if reading.at < job_started_at - timedelta(seconds=max_future_seconds):
        raise ValidationFailed(
            "at", f"{reading.at.isoformat()} is before the job started ({job_started_at})"
        )
    last = progress_repo.last_reading(conn, job_id=job_id)
    if is_repeat(reading, last):
        return False
    check_next(reading, last)
    progress_repo.add_reading(conn, job_id=job_id, reading=reading)
    return True


def job_progress(conn: Connection, *, job_id: str) -> JobProgress:
    """The readings of ``job_id`` and their summary."""
    rows = progress_repo.readings(conn, job_id=job_id)
    return JobProgress(readings=rows, summary=summarize(rows))


def job_work(
    conn: Connection, *, job_id: str, held_gpu_seconds: float
) -> tuple[ProgressSummary | None, UnitOfWork]:
    """The job's progress summary and its unit of work: GPU-seconds per unit of progress where
    it reported some, else the whole run."""
    summary = summarize(progress_repo.readings(conn, job_id=job_id))
    return summary, unit_of_work(held_gpu_seconds, summary)
