"""Reads for cost reports: GPUs, job allocations and the waste integrals of many spans at once."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Integer, and_, func, or_, select, values
from sqlalchemy.sql import column

from service.costs.integrals import ActivityPoint, Thresholds, integrate
from service.costs.waste import USAGE_FIELDS, Allocation, Usage, plan_reads
from service.db.schema import gpus, job_gpus, jobs, nodes, rollup_1h, rollup_1m, samples
from service.db.types import UTCDateTime

CHUNK = 1500  # spans per statement: 4 bound values each stays under SQLite's 32766 limit
_INTEGRALS = USAGE_FIELDS[:6]


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """What a report needs of a GPU: its id, uuid, model and node."""

    id: int
    uuid: str
    model: str
    node: str


def load_gpus(conn: Connection, *, gpu_ids: Sequence[int] | None = None) -> dict[int, GpuInfo]:
    """The GPUs (all, or ``gpu_ids``) by internal id."""
    q = select(gpus.c.id, gpus.c.uuid, gpus.c.model, nodes.c.hostname).join(
        nodes, nodes.c.id == gpus.c.node_id
    )
    if gpu_ids is not None:
        q = q.where(gpus.c.id.in_(list(gpu_ids)))
    return {r.id: GpuInfo(r.id, r.uuid, r.model, r.hostname) for r in conn.execute(q)}


def load_allocations(
    conn: Connection,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    gpu_ids: Sequence[int] | None = None,
) -> list[Allocation]:
    """Every (job, GPU) interval overlapping [start, end); open ones end at the job's end or now."""
    q = (
        select(
            job_gpus.c.job_id,
            job_gpus.c.gpu_id,
            job_gpus.c.started_at,
            job_gpus.c.ended_at,
            jobs.c.ended_at.label("job_ended_at"),
        )
        .join(jobs, jobs.c.id == job_gpus.c.job_id)
        .where(
            job_gpus.c.started_at < end,
            or_(job_gpus.c.ended_at.is_(None), job_gpus.c.ended_at > start),
        )
    )
    if gpu_ids is not None:
        q = q.where(job_gpus.c.gpu_id.in_(list(gpu_ids)))
    out = []
    for r in conn.execute(q):
        stop = r.ended_at or r.job_ended_at or now
        out.append(Allocation(r.job_id, r.gpu_id, r.started_at, min(stop, now)))
    return out


def load_jobs(conn: Connection, *, job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The jobs rows of ``job_ids`` as dicts, by id."""
    out: dict[str, dict[str, Any]] = {}
    ids = list(job_ids)
    for i in range(0, len(ids), CHUNK):
        for r in conn.execute(select(jobs).where(jobs.c.id.in_(ids[i : i + CHUNK]))):
            out[r.id] = dict(r._mapping)
    return out


def _spans(name: str, rows: list[tuple[int, int, datetime, datetime]]) -> Any:
    return (
        values(
            column("k", Integer),
            column("gpu_id", Integer),
            column("lo", UTCDateTime()),
            column("hi", UTCDateTime()),
            name=name,
        )
        .data(rows)
        .cte(name)
    )


def _sum_buckets(
    conn: Connection, table: Any, reads: list[tuple[int, int, datetime, datetime]], out: list[Usage]
) -> None:
    """Add the bucket sums of each read (k, gpu_id, lo, hi) into ``out[k]``."""
    t = table.c
    cols = [func.sum(t[f]) for f in _INTEGRALS] + [
        func.sum(t.tensor_active_sum),
        func.sum(t.tensor_active_count),
        func.sum(t.dram_active_sum),
        func.sum(t.dram_active_count),
    ]
    for i in range(0, len(reads), CHUNK):
        v = _spans("spans", reads[i : i + CHUNK])
        q = (
            select(v.c.k, *cols)
            .select_from(
                v.join(
                    table,
                    and_(t.gpu_id == v.c.gpu_id, t.bucket_start >= v.c.lo, t.bucket_start < v.c.hi),
                )
            )
            .group_by(v.c.k)
        )
        for row in conn.execute(q):
            u = out[row[0]]
            for f, value in zip(USAGE_FIELDS, row[1:], strict=True):
                if value is not None:
                    setattr(u, f, getattr(u, f) + float(value))


def _raw(
    conn: Connection,
    reads: list[tuple[int, int, datetime, datetime]],
    out: list[Usage],
    thresholds: Thresholds,
) -> None:
    """Integrate raw samples for each read (k, gpu_id, lo, hi) into ``out[k]``."""
    gap = timedelta(seconds=thresholds.max_gap_seconds)
    s = samples.c
    bounds = {k: (lo, hi) for k, _, lo, hi in reads}
    for i in range(0, len(reads), CHUNK):
        chunk = [(k, g, lo - gap, hi) for k, g, lo, hi in reads[i : i + CHUNK]]
        v = _spans("raw_spans", chunk)
        q = (
            select(
                v.c.k,
                s.ts,
                s.sm_active,
                s.gpu_util,
                s.fb_used_bytes,
                s.power_watts,
                s.tensor_active,
                s.dram_active,
            )
            .select_from(
                v.join(samples, and_(s.gpu_id == v.c.gpu_id, s.ts >= v.c.lo, s.ts < v.c.hi))
            )
            .order_by(v.c.k, s.ts)
        )
        grouped: dict[int, list[Any]] = defaultdict(list)
        for row in conn.execute(q):
            grouped[row.k].append(row)
        for k, rows in grouped.items():
            lo, hi = bounds[k]
            points = [
                ActivityPoint(
                    r.ts.timestamp(), r.sm_active, r.gpu_util, r.fb_used_bytes, r.power_watts
                )
                for r in rows
            ]
            integ = integrate(points, lo.timestamp(), hi.timestamp(), thresholds)
            u = out[k]
            for f in _INTEGRALS:
                setattr(u, f, getattr(u, f) + getattr(integ, f))
            for r in rows:
                if lo <= r.ts < hi:
                    if r.tensor_active is not None:
                        u.tensor_active_sum += r.tensor_active
                        u.tensor_active_count += 1
                    if r.dram_active is not None:
                        u.dram_active_sum += r.dram_active
                        u.dram_active_count += 1


def _prorated(
    conn: Connection, reads: list[tuple[int, int, datetime, datetime]], out: list[Usage]
) -> None:
    """Past raw retention: take the part (hi - lo) / 60 s of the 1m bucket holding each read."""
    tmp: list[Usage] = [Usage() for _ in out]
    minute_reads = []
    for k, g, lo, _hi in reads:
        bucket = lo - timedelta(seconds=lo.timestamp() % 60)
        minute_reads.append((k, g, bucket, bucket + timedelta(minutes=1)))
    _sum_buckets(conn, rollup_1m, minute_reads, tmp)
    for k, _, lo, hi in reads:
        out[k].add(tmp[k], (hi - lo).total_seconds() / 60.0)


def fetch_usage(
    conn: Connection,
    *,
    spans: Sequence[tuple[int, datetime, datetime]],
    thresholds: Thresholds,
    raw_cutoff: datetime,
) -> list[Usage]:
    """The Usage of each (gpu_id, start, end): 1h buckets inside, 1m and raw data at the edges.

    Seconds before ``raw_cutoff`` (raw retention) are taken pro rata from their 1m bucket.
    """
    out = [Usage() for _ in spans]
    hour: list[tuple[int, int, datetime, datetime]] = []
    minute: list[tuple[int, int, datetime, datetime]] = []
    raw: list[tuple[int, int, datetime, datetime]] = []
    prorate: list[tuple[int, int, datetime, datetime]] = []
    for k, (gpu_id, start, end) in enumerate(spans):
        for r in plan_reads(start, end):
            item = (k, gpu_id, r.start, r.end)
            if r.kind == "1h":
                hour.append(item)
            elif r.kind == "1m":
                minute.append(item)
            elif r.start >= raw_cutoff:
                raw.append(item)
            else:
                prorate.append(item)
    # Rows of several reads of one span add into the same Usage, so keys repeat: sum per read.
    for table, reads in ((rollup_1h, hour), (rollup_1m, minute)):
        if reads:
            keyed = list(enumerate(reads))
            tmp = [Usage() for _ in keyed]
            _sum_buckets(conn, table, [(j, g, lo, hi) for j, (_, g, lo, hi) in keyed], tmp)
            for j, (k, *_rest) in keyed:
                out[k].add(tmp[j])
    if raw:
        keyed_raw = list(enumerate(raw))
        tmp = [Usage() for _ in keyed_raw]
        _raw(conn, [(j, g, lo, hi) for j, (_, g, lo, hi) in keyed_raw], tmp, thresholds)
        for j, (k, *_rest) in keyed_raw:
            out[k].add(tmp[j])
    if prorate:
        keyed_p = list(enumerate(prorate))
        tmp = [Usage() for _ in keyed_p]
        _prorated(conn, [(j, g, lo, hi) for j, (_, g, lo, hi) in keyed_p], tmp)
        for j, (k, *_rest) in keyed_p:
            out[k].add(tmp[j])
    return out
