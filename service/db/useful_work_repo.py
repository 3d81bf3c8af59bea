"""Storage of the useful-work verdict (issue 47): the windows it reads (samples, the processes'
host side, progress, the jobs holding each GPU) and the causes it writes back."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Connection, and_, func, or_, select, update

from service.core.diagnosis import Cause
from service.core.useful_work import GpuPoint, Hold, HostPoint
from service.db import foreground
from service.db.dialect import bulk_insert
from service.db.ingest_samples import dirty_range
from service.db.observed_jobs_repo import OBSERVED
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
class GpuSeries:
    """One GPU over a time range: its samples, the holds of the jobs on it then, and per job
    (None: a process no job was named for) its processes' host readings, labels and progress."""

    gpu_id: int
    uuid: str
    holds: list[Hold] = field(default_factory=list)
    samples: list[GpuPoint] = field(default_factory=list)
    host: dict[str | None, list[HostPoint]] = field(default_factory=dict)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    progress: dict[str, list[tuple[float, float]]] = field(default_factory=dict)


def series(
    conn: Connection, *, start: datetime, end: datetime, job_id: str | None = None
) -> list[GpuSeries]:
    """[start, end] of every GPU some job held in it (a GPU no job held has no verdict: its
    idle time is the idle causes'), or only those ``job_id`` held (their holds then being
    its own only); each series' lists in time order."""
    jg = job_gpus.c
    only = [jg.job_id == job_id] if job_id is not None else []
    held = conn.execute(
        select(jg.gpu_id, jg.job_id, jg.started_at, jg.ended_at, jg.source, gpus.c.uuid,
               jobs.c.labels)
        .join(gpus, gpus.c.id == jg.gpu_id)
        .join(jobs, jobs.c.id == jg.job_id)
        .where(jg.started_at <= end, or_(jg.ended_at.is_(None), jg.ended_at >= start), *only)
    ).all()  # fmt: skip
    if not held:
        return []
    p = gpu_processes.c
    open_observed = {(r.gpu_id, r.job_id) for r in held if r.ended_at is None and
                     r.source == OBSERVED}  # fmt: skip
    last_seen: dict[tuple[int, str], float] = {}
    if open_observed:
        for gid, job, at in conn.execute(
            select(p.gpu_id, p.job_id, func.max(p.ts))
            .where(p.gpu_id.in_({g for g, _ in open_observed}), p.ts >= start, p.ts <= end)
            .where(p.job_id.in_({j for _, j in open_observed}))
            .group_by(p.gpu_id, p.job_id)
        ):
            last_seen[(gid, job)] = at.timestamp()
    out: dict[int, GpuSeries] = {}
    for r in held:
        s = out.setdefault(r.gpu_id, GpuSeries(r.gpu_id, r.uuid))
        s.holds.append(
            Hold(
                job_id=r.job_id,
                start=r.started_at.timestamp(),
                end=r.ended_at.timestamp() if r.ended_at is not None else None,
                observed=r.source == OBSERVED,
                last_seen=last_seen.get((r.gpu_id, r.job_id)),
            )
        )
        s.labels[r.job_id] = dict(r.labels or {})
    ids = sorted(out)
    for row in foreground.every_rows(
        conn.execute(
            select(samples.c.gpu_id, samples.c.ts, *(samples.c[m] for m in _METRICS))
            .where(samples.c.gpu_id.in_(ids), samples.c.ts >= start, samples.c.ts <= end)
            .order_by(samples.c.gpu_id, samples.c.ts)
        )
    ):
        values = {m: getattr(row, m) for m in _METRICS if getattr(row, m) is not None}
        out[row.gpu_id].samples.append(GpuPoint(row.ts.timestamp(), values))
    for h in conn.execute(
        select(p.gpu_id, p.ts, p.pid, p.job_id, p.host_cpu_seconds, p.host_read_bytes,
               p.host_write_bytes, p.host_voluntary_switches, p.host_children)
        .where(p.gpu_id.in_(ids), p.ts >= start, p.ts <= end, p.host_read_bytes.is_not(None))
        .order_by(p.gpu_id, p.ts)
    ):  # fmt: skip
        out[h.gpu_id].host.setdefault(h.job_id, []).append(
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
        .where(job_progress.c.job_id.in_({r.job_id for r in held}))
        .where(job_progress.c.at >= start, job_progress.c.at <= end)
        .order_by(job_progress.c.at)
    ):
        by_job.setdefault(g.job_id, []).append((g.at.timestamp(), g.value))
    for s in out.values():
        s.progress = {j: by_job[j] for j in s.labels if j in by_job}
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
