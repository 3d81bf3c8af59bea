"""Moving an ended job's record aside when its id is reused by a new run (a wrapped Slurm id),
with everything stored under its id: intervals, conflicts, costs, tenant minutes, alerts, the
ladder's progress and actions, notices and process hints."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column, Connection, delete, select, update

from service.core.job_runs import is_new_run, moved_job_id
from service.db.dialect import insert_ignore
from service.db.schema import (
    alerts,
    cost_job_1d,
    gpu_processes,
    job_conflicts,
    job_gpus,
    jobs,
    ladder_actions,
    ladder_progress,
    notices,
    tenant_1d,
    tenant_1h,
    tenant_1m,
)

# Every column outside ``jobs`` that names a job by its id (job_gpus and job_conflicts point at
# jobs.id; the others copy it), all moved with the record. gpu_processes is moved by time.
_JOB_ID_COLUMNS: tuple[Column[str], ...] = (
    job_gpus.c.job_id,
    job_conflicts.c.job_id,
    cost_job_1d.c.job_id,
    tenant_1m.c.tenant,
    tenant_1h.c.tenant,
    tenant_1d.c.tenant,
    alerts.c.job_id,
    ladder_progress.c.job_id,
    ladder_actions.c.job_id,
    notices.c.job_id,
)


def set_aside_ended_run(
    conn: Connection, *, job_id: str, started_at: datetime, now: datetime
) -> str | None:
    """Move job ``job_id``'s stored record to its moved id if a run starting at ``started_at``
    is a new job of a reused id (see ``is_new_run``); returns the moved id, or None."""
    old = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
    if old is None or not is_new_run(
        job_id, old_started_at=old.started_at, old_ended_at=old.ended_at, started_at=started_at
    ):
        return None
    moved = moved_job_id(job_id, old.started_at)
    copy = {**old._mapping, "id": moved, "updated_at": now}
    inserted = conn.execute(
        insert_ignore(conn, jobs, ["id"]).values(**copy).returning(jobs.c.id)
    ).first()
    if inserted is None:
        return None  # moved already (another node's registration of the new run)
    for column in _JOB_ID_COLUMNS:
        conn.execute(update(column.table).where(column == job_id).values({column.name: moved}))
    # Process hints name the job as the scheduler did: those before the new run are the old's.
    conn.execute(
        update(gpu_processes)
        .where(gpu_processes.c.job_id == job_id, gpu_processes.c.ts < started_at)
        .values(job_id=moved)
    )
    conn.execute(delete(jobs).where(jobs.c.id == job_id))
    return moved
