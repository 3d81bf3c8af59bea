"""Wasted dollars so far for a job: rollup unused seconds times the job's GPU price."""

from __future__ import annotations

import fnmatch
from datetime import datetime

from sqlalchemy import Connection, and_, func, or_, select

from service.db.schema import gpus, job_gpus, prices, rollup_1m
from service.settings import Settings


def _price(rows: list[tuple[str, float]], model: str) -> float | None:
    """USD per GPU-hour for ``model``: the longest matching pattern among the current prices."""
    best: tuple[int, float] | None = None
    for pattern, usd in rows:
        if fnmatch.fnmatchcase(model, pattern) and (best is None or len(pattern) > best[0]):
            best = (len(pattern), usd)
    return None if best is None else best[1]


def job_wasted_usd(
    conn: Connection, *, job_id: str, now: datetime, settings: Settings
) -> float | None:
    """Unused (1 - sm_active) GPU time of ``job_id`` up to ``now`` in USD; None without a price.

    Placeholder until issue 4's waste model lands: sums whole 1-minute rollup buckets inside each
    job_gpus interval.
    """
    del settings  # the full model will need thresholds; the signature is the lead's contract
    # Latest effective price per pattern as of now.
    latest = (
        select(prices.c.model_pattern, func.max(prices.c.effective_from).label("eff"))
        .where(prices.c.effective_from <= now)
        .group_by(prices.c.model_pattern)
        .subquery()
    )
    price_rows = [
        (r.model_pattern, float(r.usd_per_gpu_hour))
        for r in conn.execute(
            select(prices.c.model_pattern, prices.c.usd_per_gpu_hour).join(
                latest,
                and_(
                    latest.c.model_pattern == prices.c.model_pattern,
                    latest.c.eff == prices.c.effective_from,
                ),
            )
        )
    ]
    if not price_rows:
        return None
    q = (
        select(gpus.c.model, func.sum(rollup_1m.c.unused_seconds).label("unused"))
        .select_from(job_gpus)
        .join(gpus, gpus.c.id == job_gpus.c.gpu_id)
        .join(
            rollup_1m,
            and_(
                rollup_1m.c.gpu_id == job_gpus.c.gpu_id,
                rollup_1m.c.bucket_start >= job_gpus.c.started_at,
                rollup_1m.c.bucket_start < now,
                or_(job_gpus.c.ended_at.is_(None), rollup_1m.c.bucket_start < job_gpus.c.ended_at),
            ),
        )
        .where(job_gpus.c.job_id == job_id)
        .group_by(gpus.c.model)
    )
    total, priced = 0.0, False
    for model, unused in conn.execute(q):
        usd = _price(price_rows, model)
        if usd is not None:
            priced = True
            total += usd * float(unused or 0.0) / 3600.0
    if not priced:
        # No rollups yet still has a price if any of the job's GPUs match one.
        models = conn.execute(
            select(gpus.c.model)
            .join(job_gpus, job_gpus.c.gpu_id == gpus.c.id)
            .where(job_gpus.c.job_id == job_id)
        ).scalars()
        if not any(_price(price_rows, m) is not None for m in models):
            return None
    return total
