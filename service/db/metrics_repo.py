"""Reads for /metrics: the latest sample of every recently reporting GPU, lost GPUs and prices."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Connection, and_, or_, select

from service.costs.price_match import PriceRow
from service.db.schema import gpus, job_gpus, jobs, nodes, prices, samples
from service.exposition.fleet import FleetSnapshot, GpuReading, LostGpu
from service.vocabulary import METRIC_NAMES


def read_fleet(conn: Connection, *, now: datetime, max_gap_seconds: float) -> FleetSnapshot:
    """GPUs whose latest sample is at most ``max_gap_seconds`` old, with their open job."""
    fresh_since = now - timedelta(seconds=max_gap_seconds)
    open_jobs = (
        select(
            job_gpus.c.gpu_id,
            job_gpus.c.started_at,
            jobs.c.id.label("job_id"),
            jobs.c.user,
            jobs.c.team,
        )
        .join(jobs, jobs.c.id == job_gpus.c.job_id)
        .where(
            job_gpus.c.started_at <= now,
            or_(job_gpus.c.ended_at.is_(None), job_gpus.c.ended_at > now),
            or_(jobs.c.ended_at.is_(None), jobs.c.ended_at > now),
        )
        .subquery()
    )
    metric_cols = [samples.c[m] for m in METRIC_NAMES]
    query = (
        select(
            gpus.c.id,
            gpus.c.uuid,
            gpus.c.gpu_index,
            gpus.c.model,
            gpus.c.fb_total_bytes,
            gpus.c.mig_parent_uuid,
            gpus.c.last_sample_at,
            nodes.c.hostname,
            samples.c.source,
            open_jobs.c.job_id,
            open_jobs.c.user,
            open_jobs.c.team,
            *metric_cols,
        )
        .join(nodes, nodes.c.id == gpus.c.node_id)
        .join(samples, and_(samples.c.gpu_id == gpus.c.id, samples.c.ts == gpus.c.last_sample_at))
        .outerjoin(open_jobs, open_jobs.c.gpu_id == gpus.c.id)
        .where(gpus.c.last_sample_at >= fresh_since)
        # A GPU shared by several open jobs yields several rows; the latest-started job wins.
        .order_by(gpus.c.id, open_jobs.c.started_at)
    )
    first_metric = 12
    by_gpu: dict[int, GpuReading] = {}
    for row in conn.execute(query):
        values = {
            name: v
            for name, v in zip(METRIC_NAMES, row[first_metric:], strict=True)
            if v is not None
        }
        by_gpu[row[0]] = GpuReading(
            node=row.hostname,
            index=row.gpu_index,
            uuid=row.uuid,
            model=row.model,
            last_sample_at=row.last_sample_at,
            values=values,
            source=row.source,
            fb_total_bytes=row.fb_total_bytes,
            mig_parent_uuid=row.mig_parent_uuid,
            job_id=row.job_id,
            user=row.user,
            team=row.team,
        )
    lost = [
        LostGpu(node=r.hostname, index=r.gpu_index, uuid=r.uuid, model=r.model)
        for r in conn.execute(
            select(nodes.c.hostname, gpus.c.gpu_index, gpus.c.uuid, gpus.c.model)
            .join(nodes, nodes.c.id == gpus.c.node_id)
            .where(gpus.c.lost_at.is_not(None), nodes.c.last_seen_at >= fresh_since)
            .order_by(nodes.c.hostname, gpus.c.gpu_index)
        )
    ]
    price_rows = [
        PriceRow(r.model_pattern, r.usd_per_gpu_hour, r.effective_from)
        for r in conn.execute(
            select(prices.c.model_pattern, prices.c.usd_per_gpu_hour, prices.c.effective_from)
        )
    ]
    return FleetSnapshot(readings=list(by_gpu.values()), lost=lost, prices=price_rows)
