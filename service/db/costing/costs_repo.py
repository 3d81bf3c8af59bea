"""Reads for cost reports: the GPUs and the job allocations a report covers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, func, or_, select, type_coerce

from service.core.buckets import HOUR, ceil_minute, ceil_to, floor_hour, floor_minute
from service.costs.waste import Allocation
from service.db.schema import (
    gpus,
    job_gpus,
    jobs,
    nodes,
    rollup_1h,
    rollup_1m,
    rollup_dirty,
    samples,
)
from service.db.types import UTCDateTime


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """What a report needs of a GPU: its id, uuid, model, node and since when it is known."""

    id: int
    uuid: str
    model: str
    node: str
    known_from: datetime  # its first sample (first seen where it sent none): held from then
    lost_at: datetime | None = None  # since when it is lost (fell off the bus), while it is
    retired_at: datetime | None = None  # a MIG instance destroyed: held no longer after this


def load_gpus(conn: Connection, *, gpu_ids: Sequence[int] | None = None) -> dict[int, GpuInfo]:
    """The GPUs (all, or ``gpu_ids``) by internal id."""
    query = select(
        gpus.c.id,
        gpus.c.uuid,
        gpus.c.model,
        nodes.c.hostname,
        gpus.c.first_seen_at,
        gpus.c.first_sample_at,
        gpus.c.lost_at,
        gpus.c.retired_at,
    ).join(nodes, nodes.c.id == gpus.c.node_id)
    if gpu_ids is not None:
        query = query.where(gpus.c.id.in_(list(gpu_ids)))
    return {
        gpu_id: GpuInfo(gpu_id, uuid, model, node, known_from(seen, sample), lost, retired)
        for gpu_id, uuid, model, node, seen, sample, lost, retired in conn.execute(query).all()
    }


def known_from(first_seen_at: datetime, first_sample_at: datetime | None) -> datetime:
    """Since when a GPU is held: its first sample (a spool replayed later moves it back), not
    the minute before it; when it was first seen for a GPU that never sent one."""
    return first_seen_at if first_sample_at is None else first_sample_at


BIND_IDS_MAX = 1000  # past this many GPU ids, reading every GPU costs less than binding them


def rolled_until(conn: Connection, *, gpu_ids: Sequence[int] | None) -> dict[int, datetime | None]:
    """Per GPU (all, or ``gpu_ids``), up to when its 1m rollups are complete: its first minute
    with samples not rolled up yet, else the end of its last bucket; None for a GPU with no
    bucket at all."""
    last = select(func.max(rollup_1m.c.bucket_start)).where(rollup_1m.c.gpu_id == gpus.c.id)
    query = select(gpus.c.id, type_coerce(last.scalar_subquery(), UTCDateTime()))
    d = rollup_dirty.c
    # The dirty marks in one grouped scan, not a probe per GPU: the rollup deletes the marks it
    # rolls up, and until a vacuum each probe steps over every dead one of its GPU (122,000 of
    # them right after a fleet's two hours arrived: 25-35 ms against 4-8 ms).
    first_dirty = select(d.gpu_id, type_coerce(func.min(d.bucket_start), UTCDateTime()))
    if gpu_ids is not None:
        ids = list(gpu_ids)
        query = query.where(gpus.c.id.in_(ids))
        first_dirty = first_dirty.where(d.gpu_id.in_(ids))
    dirty_of: dict[int, datetime] = dict(conn.execute(first_dirty.group_by(d.gpu_id)).all())
    out: dict[int, datetime | None] = {}
    for gpu_id, last_bucket in conn.execute(query).all():
        dirty = dirty_of.get(gpu_id)
        ends = [t for t in (last_bucket and last_bucket + timedelta(minutes=1), dirty) if t]
        out[gpu_id] = min(ends) if ends else None
    return out


def load_allocations(
    conn: Connection,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    gpu_ids: Sequence[int] | None = None,
) -> tuple[list[Allocation], dict[str, dict[str, Any]]]:
    """Every (job, GPU) interval overlapping [start, end) (open ones end at the job's end or
    now), and the id, user, team and project of their jobs, by id."""
    query = (
        select(
            job_gpus.c.job_id,
            job_gpus.c.gpu_id,
            job_gpus.c.started_at,
            type_coerce(func.coalesce(job_gpus.c.ended_at, jobs.c.ended_at), UTCDateTime()),
            jobs.c.user,
            jobs.c.team,
            jobs.c.project,
        )
        .join(jobs, jobs.c.id == job_gpus.c.job_id)
        .where(
            job_gpus.c.started_at < end,
            or_(job_gpus.c.ended_at.is_(None), job_gpus.c.ended_at > start),
        )
    )
    if gpu_ids is not None:
        query = query.where(job_gpus.c.gpu_id.in_(list(gpu_ids)))
    allocations, job_info = [], {}
    # fetchall and tuple unpacking: iterating a result fetches row by row, and attribute
    # access on rows costs more than the rest of this loop.
    for job_id, gpu_id, started, ended, user, team, project in conn.execute(query).all():
        stop = now if ended is None or ended > now else ended
        allocations.append(Allocation(job_id, gpu_id, started, stop))
        if job_id not in job_info:
            job_info[job_id] = {"id": job_id, "user": user, "team": team, "project": project}
    return allocations, job_info


def gpu_memory_totals(conn: Connection, *, gpu_ids: Sequence[int]) -> dict[int, int | None]:
    """Each GPU's total framebuffer (bytes, None where unknown) by internal id."""
    query = select(gpus.c.id, gpus.c.fb_total_bytes).where(gpus.c.id.in_(list(gpu_ids)))
    return {gpu_id: total for gpu_id, total in conn.execute(query).all()}


# What a smaller allocation must hold, per GPU: the most memory in use, and the busiest
# minute's DRAM activity and PCIe / NVLink throughput (each direction).
PEAK_METRICS = (
    "fb_used_bytes",
    "dram_active",
    "pcie_tx_bytes_per_second",
    "pcie_rx_bytes_per_second",
    "nvlink_tx_bytes_per_second",
    "nvlink_rx_bytes_per_second",
)


def _bucket_peak(table: Any, name: str) -> Any:
    """A bucket's figure of metric ``name``: its largest sample for memory (a slice must hold
    the peak), its mean for the rates (what the minute, or hour, moved)."""
    c = table.c
    if name == "fb_used_bytes":
        return c.fb_used_bytes_max
    return c[f"{name}_sum"] / func.nullif(c[f"{name}_count"], 0)


def peak_usage(
    conn: Connection, *, gpu_ids: Sequence[int], start: datetime, end: datetime
) -> dict[int, dict[str, float]]:
    """Each GPU's peaks of ``PEAK_METRICS`` during [start, end): the most framebuffer in use
    (bytes), the busiest bucket's mean DRAM activity (ratio) and PCIe / NVLink rates (bytes
    per second, each direction); metrics a GPU never reported, and GPUs without samples, left
    out. A few statements whatever the number of GPUs.

    Whole hours are read from the 1h rollups, whole minutes at their edges from the 1m
    rollups; the seconds at the edges, and every minute after the last one rolled up on all of
    the GPUs, from raw samples (a job seconds old has no rollup).
    """
    ids = list(gpu_ids)
    peaks: dict[int, dict[str, float]] = {}

    def add(rows: Any) -> None:
        for gpu_id, *values in rows:
            mine = peaks.setdefault(gpu_id, {})
            for name, value in zip(PEAK_METRICS, values, strict=True):
                if value is not None:
                    mine[name] = max(mine.get(name, 0.0), float(value))

    lo, hi = ceil_minute(start), floor_minute(end)
    done = lo
    if lo < hi:
        m = rollup_1m.c
        last = (
            select(func.max(m.bucket_start))
            .where(m.gpu_id == gpus.c.id, m.bucket_start >= lo, m.bucket_start < hi)
            .scalar_subquery()
        )
        lasts = [v for (v,) in conn.execute(select(last).where(gpus.c.id.in_(ids))).all()]
        if lasts and all(v is not None for v in lasts):
            done = min(hi, min(_as_utc(v) for v in lasts) + timedelta(minutes=1))
        h0, h1 = ceil_to(lo, HOUR), floor_hour(done)
        parts = [(rollup_1m, [(lo, done)])]
        if h0 < h1:
            parts = [(rollup_1h, [(h0, h1)]), (rollup_1m, [(lo, h0), (h1, done)])]
        for table, ranges in parts:
            c = table.c
            within = [and_(c.bucket_start >= a, c.bucket_start < z) for a, z in ranges if a < z]
            if within:
                cols = [func.max(_bucket_peak(table, name)) for name in PEAK_METRICS]
                add(
                    conn.execute(
                        select(c.gpu_id, *cols)
                        .where(c.gpu_id.in_(ids), or_(*within))
                        .group_by(c.gpu_id)
                    ).all()
                )
    s = samples.c
    within = [
        and_(s.ts >= a, s.ts < z) for a, z in ((start, min(lo, end)), (max(done, start), end))
    ]
    add(
        conn.execute(
            select(s.gpu_id, *[func.max(s[name]) for name in PEAK_METRICS])
            .where(s.gpu_id.in_(ids), or_(*within))
            .group_by(s.gpu_id)
        ).all()
    )
    return peaks


def _as_utc(value: Any) -> datetime:
    """A max() over a timestamp column (SQLite hands back text there, not a datetime)."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    parsed = datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def energy_counters(
    conn: Connection, *, gpu_ids: Sequence[int], start: datetime, end: datetime
) -> dict[int, tuple[float, float]]:
    """Each GPU's energy counter over [start, end) from raw samples: (joules between its first
    and last reading, seconds between them); GPUs with fewer than two readings or a reset
    (driver reload) are left out. One statement, two index probes each way per GPU."""
    s = samples.c
    cols = []
    for order in (s.ts.asc(), s.ts.desc()):
        for col in (s.ts, s.energy_joules):
            cols.append(
                type_coerce(
                    select(col)
                    .where(
                        s.gpu_id == gpus.c.id,
                        s.ts >= start,
                        s.ts < end,
                        s.energy_joules.is_not(None),
                    )
                    .order_by(order)
                    .limit(1)
                    .scalar_subquery(),
                    UTCDateTime() if col is s.ts else col.type,
                )
            )
    out: dict[int, tuple[float, float]] = {}
    rows = conn.execute(select(gpus.c.id, *cols).where(gpus.c.id.in_(list(gpu_ids)))).all()
    for gpu_id, t0, e0, t1, e1 in rows:
        if t0 is None or t1 is None or e0 is None or e1 is None:
            continue
        seconds = (t1 - t0).total_seconds()
        if seconds > 0 and e1 >= e0:
            out[gpu_id] = (float(e1 - e0), seconds)
    return out
