"""A job's progress readings (issue 46): append one, read the last, read them all in order."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, insert, select

from service.core.progress import Reading, check_unit
from service.db.schema import job_progress


def _reading(at: datetime, unit: str, value: float) -> Reading:
    return Reading(at=at, unit=check_unit(unit), value=float(value))


def add_reading(conn: Connection, *, job_id: str, reading: Reading) -> None:
    """Store one reading of ``job_id``, in the caller's transaction."""
    conn.execute(
        insert(job_progress).values(
            job_id=job_id, at=reading.at, unit=reading.unit, value=reading.value
        )
    )


def last_reading(conn: Connection, *, job_id: str) -> Reading | None:
    """The latest reading of ``job_id`` (by time, then by arrival), or None."""
    c = job_progress.c
    row = conn.execute(
        select(c.at, c.unit, c.value)
        .where(c.job_id == job_id)
        .order_by(c.at.desc(), c.id.desc())
        .limit(1)
    ).first()
    return None if row is None else _reading(row.at, row.unit, row.value)


def readings(conn: Connection, *, job_id: str) -> list[Reading]:
    """Every reading of ``job_id`` in time order."""
    c = job_progress.c
    rows = conn.execute(
        select(c.at, c.unit, c.value).where(c.job_id == job_id).order_by(c.at, c.id)
    )
    return [_reading(r.at, r.unit, r.value) for r in rows]
