"""Each job's integrals per minute of a shared GPU (``tenant_1m``): written by the rollup job,
read by the cost report."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, delete, func, or_, select, tuple_

from service.costs.integrals import INTEGRAL_FIELDS, ActivityPoint, Thresholds
from service.costs.tenants import SplitRule, TenantProcess, TenantShare, split_stretch
from service.db.dialect import bulk_insert_ignore
from service.db.schema import gpu_processes, job_gpus, rollup_dirty, samples, tenant_1m

MINUTE = timedelta(minutes=1)


def _intervals(
    conn: Connection, gpu_id: int, lo: datetime, hi: datetime
) -> list[tuple[int, str, float, float]]:
    """(interval id, job, start, end in Unix seconds) of the intervals on ``gpu_id`` that
    overlap [lo, hi); an open interval ends at infinity."""
    c = job_gpus.c
    rows = conn.execute(
        select(c.id, c.job_id, c.started_at, c.ended_at).where(
            c.gpu_id == gpu_id,
            c.started_at < hi,
            or_(c.ended_at.is_(None), c.ended_at > lo),
        )
    ).all()
    return [
        (int(i), str(j), s.timestamp(), e.timestamp() if e is not None else float("inf"))
        for i, j, s, e in rows
    ]


def _shared(intervals: Sequence[tuple[int, str, float, float]], lo: float, hi: float) -> bool:
    """Whether two different jobs hold the GPU at one moment of [lo, hi)."""
    spans = [(max(s, lo), min(e, hi), j) for _, j, s, e in intervals if s < hi and e > lo]
    for a in spans:
        for b in spans:
            if a[2] != b[2] and a[0] < b[1] and b[0] < a[1]:
                return True
    return False


def delete_minutes(conn: Connection, keys: Sequence[tuple[int, datetime]]) -> None:
    """Drop the tenant rows of these (GPU, minute) keys."""
    for i in range(0, len(keys), 500):
        chunk = list(keys[i : i + 500])
        conn.execute(
            delete(tenant_1m).where(tuple_(tenant_1m.c.gpu_id, tenant_1m.c.bucket_start).in_(chunk))
        )


def rollup_tenants(
    conn: Connection,
    *,
    gpu_id: int,
    buckets: Sequence[datetime],
    points: Sequence[ActivityPoint],
    thresholds: Thresholds,
    rule: SplitRule,
) -> int:
    """Write the tenant rows of the minutes of ``buckets`` in which jobs shared ``gpu_id``,
    from the GPU's ``points`` (sorted, from max_gap before the first bucket); returns how many
    minutes were shared. Rows of these minutes must be deleted first."""
    if not buckets:
        return 0
    lo, hi = min(buckets), max(buckets) + MINUTE
    intervals = _intervals(conn, gpu_id, lo, hi)
    if len({j for _, j, _, _ in intervals}) < 2:
        return 0
    shared = [b for b in buckets if _shared(intervals, b.timestamp(), b.timestamp() + 60.0)]
    if not shared:
        return 0
    procs, holding, first_interval = _tenancy(conn, gpu_id, intervals, shared, thresholds)
    rows: list[dict[str, Any]] = []
    for bucket in shared:
        b = bucket.timestamp()
        shares = split_stretch(points, procs, holding, b, b + 60.0, thresholds, rule)
        rows += _rows(gpu_id, bucket, shares, first_interval, rule)
    bulk_insert_ignore(conn, tenant_1m, ["gpu_id", "bucket_start", "tenant"], rows)
    return len(shared)


def _tenancy(
    conn: Connection,
    gpu_id: int,
    intervals: Sequence[tuple[int, str, float, float]],
    buckets: Sequence[datetime],
    thresholds: Thresholds,
) -> tuple[dict[float, list[TenantProcess]], dict[str, list[tuple[float, float]]], dict[str, int]]:
    """The processes listed per sample ts around ``buckets``, each job's held spans (Unix
    seconds) and its first interval id."""
    procs: dict[float, list[TenantProcess]] = defaultdict(list)
    p = gpu_processes.c
    gap = timedelta(seconds=thresholds.max_gap_seconds)
    for ts, job, fb, sm in conn.execute(
        select(p.ts, p.job_id, p.fb_used_bytes, p.sm_util).where(
            and_(p.gpu_id == gpu_id, p.ts >= min(buckets) - gap, p.ts < max(buckets) + MINUTE)
        )
    ):
        procs[ts.timestamp()].append(
            TenantProcess(job, None if fb is None else float(fb), None if sm is None else sm)
        )
    holding: dict[str, list[tuple[float, float]]] = defaultdict(list)
    first_interval: dict[str, int] = {}
    for iv, job, s, e in sorted(intervals):
        holding[job].append((s, e))
        first_interval.setdefault(job, iv)
    return procs, holding, first_interval


def _rows(
    gpu_id: int,
    bucket: datetime,
    shares: dict[str, TenantShare],
    first_interval: dict[str, int],
    rule: SplitRule,
) -> list[dict[str, Any]]:
    """Tenant rows (the columns of ``tenant_1m``) of one minute's shares."""
    rows = []
    for tenant, sh in shares.items():
        row: dict[str, Any] = {
            "gpu_id": gpu_id,
            "bucket_start": bucket,
            "tenant": tenant,
            "interval_id": first_interval.get(tenant),
            "split_rule": rule.value,
            "held_seconds": sh.held_seconds,
        }
        row.update({f: getattr(sh.integrals, f) for f in INTEGRAL_FIELDS})
        rows.append(row)
    return rows


def split_part(
    conn: Connection,
    *,
    gpu_id: int,
    start: datetime,
    end: datetime,
    thresholds: Thresholds,
    rule: SplitRule,
) -> list[dict[str, Any]]:
    """Tenant rows for the part [start, end) of one shared minute of ``gpu_id``, split from its
    raw samples as the rollup splits whole minutes (for a report window that cuts a minute)."""
    bucket = start.replace(second=0, microsecond=0)
    intervals = _intervals(conn, gpu_id, start, end)
    procs, holding, first_interval = _tenancy(conn, gpu_id, intervals, [bucket], thresholds)
    gap = timedelta(seconds=thresholds.max_gap_seconds)
    s = samples.c
    points = [
        ActivityPoint(ts.timestamp(), act, rung, cause, power)
        for ts, act, rung, cause, power in conn.execute(
            select(s.ts, s.activity, s.activity_rung, s.cause, s.power_watts)
            .where(s.gpu_id == gpu_id, s.ts >= start - gap, s.ts < end)
            .order_by(s.ts)
        )
    ]
    shares = split_stretch(
        points, procs, holding, start.timestamp(), end.timestamp(), thresholds, rule
    )
    return _rows(gpu_id, bucket, shares, first_interval, rule)


def load_minutes(
    conn: Connection, *, start: datetime, end: datetime, gpu_ids: Sequence[int] | None = None
) -> list[dict[str, Any]]:
    """The tenant rows of the minutes starting in [start - 1 min, end), oldest first."""
    t = tenant_1m.c
    q = select(tenant_1m).where(t.bucket_start > start - MINUTE, t.bucket_start < end)
    if gpu_ids is not None:
        q = q.where(t.gpu_id.in_(list(gpu_ids)))
    return [dict(r._mapping) for r in conn.execute(q.order_by(t.gpu_id, t.bucket_start))]


def _floor_minute(ts: datetime) -> datetime:
    return ts.replace(second=0, microsecond=0)


def _mark(conn: Connection, gpu_id: int, buckets: set[datetime]) -> int:
    if buckets:
        bulk_insert_ignore(
            conn,
            rollup_dirty,
            ["gpu_id", "bucket_start"],
            [{"gpu_id": gpu_id, "bucket_start": b} for b in sorted(buckets)],
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
        b = _floor_minute(lo)
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
        .where(t.gpu_id.in_(list(gpu_ids)), t.bucket_start >= _floor_minute(since))
        .distinct()
    ).all()
    by_gpu: dict[int, set[datetime]] = defaultdict(set)
    for g, b in rows:
        by_gpu[g].add(b)
    return sum(_mark(conn, g, bs) for g, bs in by_gpu.items())
