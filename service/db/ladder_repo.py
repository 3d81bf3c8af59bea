"""Storage of ladder progress: how far each policy's ladder has gone per job and alert episode."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert, select, update

from service.db.records import record_of
from service.db.schema import ladder_progress
from service.thresholds.ladder import LadderProgress


def _progress(r: Any) -> LadderProgress:
    return record_of(LadderProgress, r)


def progress_for(
    conn: Connection,
    *,
    policy: str,
    job_id: str,
    alert_id: int,
    episode_start: datetime,
    now: datetime,
    ladder_digest: str | None = None,
) -> LadderProgress:
    """The job's progress in this episode, created (active, no step done, under the ladder of
    ``ladder_digest``) on first sight."""
    t = ladder_progress
    where = (t.c.policy == policy, t.c.job_id == job_id, t.c.alert_id == alert_id)
    row = conn.execute(select(t).where(*where)).first()
    if row is None:
        conn.execute(
            insert(t).values(
                policy=policy,
                job_id=job_id,
                alert_id=alert_id,
                episode_start=episode_start,
                state="active",
                steps_done=0,
                created_at=now,
                updated_at=now,
                ladder_digest=ladder_digest,
            )
        )
        row = conn.execute(select(t).where(*where)).one()
    return _progress(row)


def active_progress(conn: Connection) -> list[LadderProgress]:
    """Every ladder still running (state active), oldest first."""
    t = ladder_progress
    rows = conn.execute(select(t).where(t.c.state == "active").order_by(t.c.id))
    return [_progress(r) for r in rows]


def mark_pending(conn: Connection, *, progress_id: int, step: int, now: datetime) -> bool:
    """Record the intent to take ``step`` (before a driver acts); False if another round has
    already recorded it, or moved this ladder on (the step is done or the ladder stopped)."""
    t = ladder_progress
    res = conn.execute(
        update(t)
        .where(
            t.c.id == progress_id,
            t.c.state == "active",
            t.c.steps_done == step,
            t.c.pending_step.is_(None),
        )
        .values(pending_step=step, updated_at=now)
    )
    return res.rowcount == 1


def finish_step(
    conn: Connection, *, progress_id: int, step: int, now: datetime, last: bool
) -> bool:
    """Count ``step`` done (once: False if it already was); the ladder is done after its last."""
    t = ladder_progress
    values: dict[str, Any] = {
        "steps_done": step + 1,
        "pending_step": None,
        "last_step_at": now,
        "updated_at": now,
    }
    if last:
        values["state"] = "done"
    res = conn.execute(
        update(t)
        .where(t.c.id == progress_id, t.c.state == "active", t.c.steps_done == step)
        .values(**values)
    )
    return res.rowcount == 1


def stop_ladder(conn: Connection, *, progress_id: int, state: str, now: datetime) -> None:
    """End a ladder without further steps: gone (the job ended), reset (busy again, or the
    episode resolved) or exempt."""
    t = ladder_progress
    conn.execute(
        update(t)
        .where(t.c.id == progress_id)
        .values(state=state, pending_step=None, updated_at=now)
    )


def restart_ladder(
    conn: Connection,
    *,
    progress_id: int,
    episode_start: datetime,
    now: datetime,
    ladder_digest: str | None = None,
) -> None:
    """Start the ladder over from ``episode_start`` (the job's GPUs were busy again then, or
    the ladder changed: ``ladder_digest`` is the new one): no step done, nothing pending."""
    t = ladder_progress
    values: dict[str, Any] = {
        "episode_start": episode_start,
        "steps_done": 0,
        "pending_step": None,
        "last_step_at": None,
        "state": "active",
        "updated_at": now,
    }
    if ladder_digest is not None:
        values["ladder_digest"] = ladder_digest
    conn.execute(update(t).where(t.c.id == progress_id).values(**values))
