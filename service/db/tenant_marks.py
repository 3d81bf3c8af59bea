"""Marks for the rollup job: the minutes of a shared GPU whose tenant rows must be (re)computed
because a job's interval there was opened, reopened, closed or shortened."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Connection, func, or_, select

from service.core.buckets import MINUTE, floor_minute
from service.db.dialect import bulk_insert
from service.db.schema import job_gpus, rollup_dirty, samples, tenant_1m


def _mark(conn: Connection, gpu_id: int, buckets: set[datetime]) -> int:
    if buckets:
        bulk_insert(
            conn, rollup_dirty, [{"gpu_id": gpu_id, "bucket_start": b} for b in sorted(buckets)]
        )
    return len(buckets)


def mark_shared(
    conn: Connection, *, gpu_id: int, job_id: str, start: datetime, end: datetime | None
) -> int:
    """Mark for the rollup job the minutes in which ``job_id``'s new or reopened interval
    [start, end) on ``gpu_id`` overlaps another job's, where raw samples still hold them, so
    their tenant rows are computed although the minutes were rolled up before the job was
    known; returns how many minutes."""
    s = samples.c
    first, last = conn.execute(
        select(func.min(s.ts), func.max(s.ts)).where(s.gpu_id == gpu_id)
    ).one()
    if first is None:
        return 0
    c = job_gpus.c
    hi_all = end or last
    others = conn.execute(
        select(c.started_at, c.ended_at).where(
            c.gpu_id == gpu_id,
            c.job_id != job_id,
            c.started_at < hi_all,
            or_(c.ended_at.is_(None), c.ended_at > start),
        )
    ).all()
    buckets: set[datetime] = set()
    for o_start, o_end in others:
        lo = max(start, o_start, first)
        hi = min(hi_all, o_end or last, last)
        b = floor_minute(lo)
        while b <= hi:
            buckets.add(b)
            b += MINUTE
    return _mark(conn, gpu_id, buckets)


def mark_after(conn: Connection, *, gpu_ids: Sequence[int], since: datetime) -> int:
    """Mark for recomputation the shared minutes of ``gpu_ids`` from ``since`` on (an interval
    was closed or shortened there); returns how many minutes."""
    if not gpu_ids:
        return 0
    t = tenant_1m.c
    rows = conn.execute(
        select(t.gpu_id, t.bucket_start)
        .where(t.gpu_id.in_(list(gpu_ids)), t.bucket_start >= floor_minute(since))
        .distinct()
    ).all()
    by_gpu: dict[int, set[datetime]] = defaultdict(set)
    for g, b in rows:
        by_gpu[g].add(b)
    return sum(_mark(conn, g, bs) for g, bs in by_gpu.items())
