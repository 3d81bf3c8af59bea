"""When a job registration under a stored job's id is a new run of a reused id (a Slurm id that
wrapped at MaxJobId, or a requeued job running again), and the id the old record moves to.

Pure: ids and UTC datetimes in, a decision or an id out.
"""

from __future__ import annotations

from datetime import UTC, datetime

# Schedulers whose ids are reused for new jobs (Slurm's wrap at MaxJobId, its requeue).
REUSED_ID_PREFIXES = ("slurm:",)


def is_new_run(
    job_id: str, *, old_started_at: datetime, old_ended_at: datetime | None, started_at: datetime
) -> bool:
    """Whether a job of ``job_id`` starting at ``started_at`` is another job than the stored,
    ended one of that id (it started once that one had ended)."""
    if not job_id.startswith(REUSED_ID_PREFIXES) or old_ended_at is None:
        return False
    # The same run's registration again (a retried prolog, another node of it) starts when it
    # started, before its own end; a new run starts at or after the old one's end.
    return started_at > old_started_at and started_at >= old_ended_at


def moved_job_id(job_id: str, old_started_at: datetime) -> str:
    """The id an ended run of ``job_id`` keeps once its id names a new run:
    ``slurm:101@20261207T045500Z`` (its start, UTC, to the second)."""
    return f"{job_id}@{old_started_at.astimezone(UTC):%Y%m%dT%H%M%SZ}"
