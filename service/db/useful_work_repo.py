"""Storage of the useful-work verdict (issue 47): the windows it reads (samples, the processes'
host side, progress, the jobs holding each GPU) and the causes it writes back."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, or_, select, update

from service.core.diagnosis import Cause
from service.core.useful_work import GpuPoint, HostPoint
from service.db.dialect import bulk_insert
from service.db.ingest_samples import dirty_range
from service.db.schema import (
    gpu_processes,
    gpus,
    job_gpus,
    job_progress,
    jobs,
    rollup_dirty,
    samples,
)
from service.vocabulary import METRICS

_METRICS = tuple(m.name for m in METRICS)


@dataclass(slots=True)
class GpuWindow:
    """One GPU's window: its samples, its processes' host readings, the job holding it (one
    job; a GPU shared by several is left out), that job's labels and progress readings."""

    gpu_id: int
    uuid: str
    job_id: str
    labels: dict[str, str]
    samples: list[GpuPoint] = field(default_factory=list)
    host: list[HostPoint] = field(default_factory=list)
    progress: list[tuple[float, float]] = field(default_factory=list)


def windows(conn: Connection, *, start: datetime, end: datetime) -> list[GpuWindow]:
    """The window [start, end] of every GPU one job held through it (the GPUs of no job, or of
    several, have no verdict: idle time is the idle causes', a shared GPU is split by job)."""
    held = conn.execute(
        select(job_gpus.c.gpu_id, job_gpus.c.job_id, gpus.c.uuid, jobs.c.labels)
        .join(gpus, gpus.c.id == job_gpus.c.gpu_id)
        .join(jobs, jobs.c.id == job_gpus.c.job_id)
        .where(job_gpus.c.started_at <= start)
        .where(or_(job_gpus.c.ended_at.is_(None), job_gpus.c.ended_at >= end))
    ).all()
    holders: dict[int, list[Any]] = {}
    for r in held:
        holders.setdefault(r.gpu_id, []).append(r)
    out = {
        gid: GpuWindow(gid, rs[0].uuid, rs[0].job_id, dict(rs[0].labels or {}))
        for gid, rs in holders.items()
        if len({r.job_id for r in rs}) == 1
    }
    if not out:
        return []
    ids = sorted(out)
    for s in conn.execute(
        select(samples.c.gpu_id, samples.c.ts, *(samples.c[m] for m in _METRICS))
        .where(samples.c.gpu_id.in_(ids), samples.c.ts >= start, samples.c.ts <= end)
        .order_by(samples.c.gpu_id, samples.c.ts)
    ):
        values = {m: getattr(s, m) for m in _METRICS if getattr(s, m) is not None}
        out[s.gpu_id].samples.append(GpuPoint(s.ts.timestamp(), values))
    p = gpu_processes.c
    for h in conn.execute(
        select(p.gpu_id, p.ts, p.pid, p.host_cpu_seconds, p.host_read_bytes, p.host_write_bytes,
               p.host_voluntary_switches, p.host_children)
        .where(p.gpu_id.in_(ids), p.ts >= start, p.ts <= end, p.host_read_bytes.is_not(None))
        .order_by(p.gpu_id, p.ts)
    ):  # fmt: skip
        out[h.gpu_id].host.append(
            HostPoint(
                ts=h.ts.timestamp(),
                cpu_seconds=h.host_cpu_seconds or 0.0,
                read_bytes=float(h.host_read_bytes or 0),
                write_bytes=float(h.host_write_bytes or 0),
                voluntary_switches=float(h.host_voluntary_switches or 0),
                children=h.host_children or 0,
                pid=h.pid,
            )
        )
    by_job: dict[str, list[tuple[float, float]]] = {}
    for g in conn.execute(
        select(job_progress.c.job_id, job_progress.c.at, job_progress.c.value)
        .where(job_progress.c.job_id.in_({w.job_id for w in out.values()}))
        .where(job_progress.c.at >= start, job_progress.c.at <= end)
        .order_by(job_progress.c.at)
    ):
        by_job.setdefault(g.job_id, []).append((g.at.timestamp(), g.value))
    for w in out.values():
        w.progress = by_job.get(w.job_id, [])
    return [out[g] for g in ids]


def mark_cause(
    conn: Connection,
    *,
    gpu_id: int,
    cause: Cause,
    start: datetime,
    end: datetime,
    max_gap_seconds: float,
) -> int:
    """Give the samples of ``gpu_id`` in (start, end] ``cause`` (a keep-alive's idle gaps are
    part of it), the GPU's latest cause too where its latest sample is among them, and mark
    their minutes for the rollup; returns how many samples changed."""
    changed = conn.execute(
        update(samples)
        .where(
            and_(
                samples.c.gpu_id == gpu_id,
                samples.c.ts > start,
                samples.c.ts <= end,
                samples.c.cause.is_not(None),
                samples.c.cause != int(cause),
            )
        )
        .values(cause=int(cause))
    ).rowcount
    if changed:
        conn.execute(
            update(gpus)
            .where(gpus.c.id == gpu_id, gpus.c.last_sample_at > start)
            .where(gpus.c.last_sample_at <= end)
            .values(last_cause=int(cause))
        )
        bulk_insert(
            conn,
            rollup_dirty,
            [
                {"gpu_id": gpu_id, "bucket_start": b}
                for b in dirty_range(start, end, max_gap_seconds)
            ],
        )
    return int(changed or 0)
