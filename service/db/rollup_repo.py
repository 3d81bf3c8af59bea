"""Keeps the 1-minute and 1-hour rollups current by recomputing buckets that ingest marked dirty."""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Row, Table, delete, insert, select, tuple_

from service.costs.integrals import ActivityPoint, Integrals, Thresholds, integrate
from service.db.schema import rollup_1h, rollup_1m, rollup_dirty, samples
from service.vocabulary import METRIC_NAMES

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
INTEGRAL_FIELDS = (
    "covered_seconds",
    "idle_seconds",
    "idle_held_seconds",
    "unused_seconds",
    "fallback_seconds",
    "energy_used_joules",
)


def _point(row: Row[Any]) -> ActivityPoint:
    return ActivityPoint(
        ts=row.ts.timestamp(),
        sm_active=row.sm_active,
        gpu_util=row.gpu_util,
        fb_used_bytes=row.fb_used_bytes,
        power_watts=row.power_watts,
    )


def minute_rollup(
    gpu_id: int, bucket: datetime, rows: Sequence[Row[Any]], thresholds: Thresholds
) -> dict[str, Any] | None:
    """The rollup row for one minute from the raw rows around it, or None when nothing is there."""
    start, end = bucket.timestamp(), (bucket + MINUTE).timestamp()
    inside = [r for r in rows if bucket <= r.ts < bucket + MINUTE]
    integrals = integrate([_point(r) for r in rows], start, end, thresholds)
    if not inside and integrals.covered_seconds == 0:
        return None
    out: dict[str, Any] = {"gpu_id": gpu_id, "bucket_start": bucket, "sample_count": len(inside)}
    out.update({f: getattr(integrals, f) for f in INTEGRAL_FIELDS})
    for name in METRIC_NAMES:
        values = [v for r in inside if (v := getattr(r, name)) is not None]
        out[f"{name}_count"] = len(values)
        out[f"{name}_sum"] = float(sum(values)) if values else None
        out[f"{name}_min"] = float(min(values)) if values else None
        out[f"{name}_max"] = float(max(values)) if values else None
    return out


def combine_rollups(gpu_id: int, bucket: datetime, parts: Sequence[Row[Any]]) -> dict[str, Any]:
    """One coarser rollup row from finer ones (sums add, min of mins, max of maxes)."""
    out: dict[str, Any] = {
        "gpu_id": gpu_id,
        "bucket_start": bucket,
        "sample_count": sum(p.sample_count for p in parts),
    }
    total = Integrals()
    for p in parts:
        total.add(Integrals(**{f: getattr(p, f) for f in INTEGRAL_FIELDS}))
    out.update({f: getattr(total, f) for f in INTEGRAL_FIELDS})
    for name in METRIC_NAMES:
        counted = [p for p in parts if getattr(p, f"{name}_count")]
        out[f"{name}_count"] = sum(getattr(p, f"{name}_count") for p in counted)
        out[f"{name}_sum"] = sum(getattr(p, f"{name}_sum") for p in counted) if counted else None
        out[f"{name}_min"] = min(getattr(p, f"{name}_min") for p in counted) if counted else None
        out[f"{name}_max"] = max(getattr(p, f"{name}_max") for p in counted) if counted else None
    return out


def _replace(
    conn: Connection, table: Table, keys: list[tuple[int, datetime]], rows: list[dict[str, Any]]
) -> None:
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        conn.execute(delete(table).where(tuple_(table.c.gpu_id, table.c.bucket_start).in_(chunk)))
    if rows:
        conn.execute(insert(table), rows)


def process_dirty(conn: Connection, *, thresholds: Thresholds, limit: int = 20_000) -> int:
    """Recompute up to ``limit`` dirty minute buckets and their hours; returns how many."""
    dirty = conn.execute(
        select(rollup_dirty.c.gpu_id, rollup_dirty.c.bucket_start)
        .order_by(rollup_dirty.c.gpu_id, rollup_dirty.c.bucket_start)
        .limit(limit)
    ).all()
    if not dirty:
        return 0
    keys = [(g, b) for g, b in dirty]
    # Delete first: an ingest that commits after this re-marks its buckets for the next round.
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        conn.execute(
            delete(rollup_dirty).where(
                tuple_(rollup_dirty.c.gpu_id, rollup_dirty.c.bucket_start).in_(chunk)
            )
        )

    by_gpu: dict[int, list[datetime]] = defaultdict(list)
    for gpu_id, bucket in keys:
        by_gpu[gpu_id].append(bucket)
    gap = timedelta(seconds=thresholds.max_gap_seconds)
    minute_rows: list[dict[str, Any]] = []
    hours: set[tuple[int, datetime]] = set()
    for gpu_id, buckets in by_gpu.items():
        lo, hi = min(buckets) - gap, max(buckets) + MINUTE
        rows = conn.execute(
            select(samples)
            .where(samples.c.gpu_id == gpu_id, samples.c.ts >= lo, samples.c.ts < hi)
            .order_by(samples.c.ts)
        ).all()
        stamps = [r.ts for r in rows]
        for bucket in buckets:
            near = rows[bisect_left(stamps, bucket - gap) : bisect_left(stamps, bucket + MINUTE)]
            row = minute_rollup(gpu_id, bucket, near, thresholds)
            if row is not None:
                minute_rows.append(row)
            hours.add((gpu_id, bucket.replace(minute=0)))
    _replace(conn, rollup_1m, keys, minute_rows)

    hour_keys = sorted(hours)
    hour_rows = []
    for gpu_id, hour in hour_keys:
        parts = conn.execute(
            select(rollup_1m).where(
                rollup_1m.c.gpu_id == gpu_id,
                rollup_1m.c.bucket_start >= hour,
                rollup_1m.c.bucket_start < hour + HOUR,
            )
        ).all()
        if parts:
            hour_rows.append(combine_rollups(gpu_id, hour, parts))
    _replace(conn, rollup_1h, hour_keys, hour_rows)
    return len(keys)


def delete_rollups_before(conn: Connection, *, table: Table, cutoff: datetime) -> int:
    """Delete rollup rows of ``table`` older than ``cutoff``; returns how many."""
    result = conn.execute(delete(table).where(table.c.bucket_start < cutoff))
    return int(result.rowcount or 0)
