"""Facts read from raw samples: the last hardware XID, missing memory, the last busy time."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import Connection, and_, func, or_, select

from service.core.diagnosis import IDLE_CAUSES
from service.db.schema import gpus, job_gpus, samples
from service.vocabulary import HARDWARE_XIDS


def last_hardware_xids(
    conn: Connection, *, gpu_uuids: Iterable[str], since: datetime, until: datetime
) -> dict[str, int]:
    """Each GPU's most recent hardware XID code (vocabulary.HARDWARE_XIDS) in raw samples from
    ``since`` to ``until``, by uuid; GPUs without one are left out."""
    wanted = sorted(set(gpu_uuids))
    if not wanted:
        return {}
    rows = conn.execute(
        select(gpus.c.uuid, samples.c.xid_last)
        .join(gpus, gpus.c.id == samples.c.gpu_id)
        .where(
            gpus.c.uuid.in_(wanted),
            samples.c.ts > since,
            samples.c.ts <= until,
            samples.c.xid_last.in_(sorted(HARDWARE_XIDS)),
        )
        .order_by(samples.c.ts)
    ).all()
    return {r.uuid: int(r.xid_last) for r in rows}  # the last row of each GPU wins


def memory_unreported(
    conn: Connection, *, gpu_uuids: Iterable[str], since: datetime, until: datetime
) -> set[str]:
    """The GPUs among ``gpu_uuids`` whose raw samples from ``since`` to ``until`` carry no
    memory reading (an exporter without the framebuffer fields)."""
    wanted = sorted(set(gpu_uuids))
    if not wanted:
        return set()
    rows = conn.execute(
        select(gpus.c.uuid, func.count(samples.c.fb_used_bytes))
        .join(gpus, gpus.c.id == samples.c.gpu_id)
        .where(gpus.c.uuid.in_(wanted), samples.c.ts > since, samples.c.ts <= until)
        .group_by(gpus.c.uuid)
    ).all()
    return {uuid for uuid, with_memory in rows if not with_memory}


def last_busy_at(
    conn: Connection, *, job_id: str, after: datetime, until: datetime
) -> datetime | None:
    """The latest sample time in (``after``, ``until``] at which something ran (a cause other
    than idle_empty or idle_held) on a GPU while ``job_id`` held it; None if nothing ran."""
    idle = [int(c) for c in IDLE_CAUSES]
    held = and_(
        job_gpus.c.gpu_id == samples.c.gpu_id,
        job_gpus.c.job_id == job_id,
        job_gpus.c.started_at <= samples.c.ts,
        or_(job_gpus.c.ended_at.is_(None), job_gpus.c.ended_at > samples.c.ts),
    )
    q = (
        select(func.max(samples.c.ts))
        .select_from(samples.join(job_gpus, held))
        .where(
            samples.c.ts > after,
            samples.c.ts <= until,
            samples.c.cause.is_not(None),
            samples.c.cause.not_in(idle),
        )
    )
    value: datetime | None = conn.execute(q).scalar()
    return value
