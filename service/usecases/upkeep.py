"""Upkeep rounds: rollups, retention, partitions, cost days, observed-job closes, the fleet's
dollars."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from sqlalchemy import Connection

from service.context import ServiceContext
from service.costs.tenants import SplitRule
from service.db import observed_jobs_repo, partitions, rollup_repo, set_aside
from service.db.outages import is_outage
from service.db.retention import enforce_retention
from service.db.set_aside import SetAside
from service.usecases.costing import cost_days
from service.usecases.fleet import WastedTodayCache, refresh_wasted_today

log = logging.getLogger(__name__)


def report_set_aside(ctx: ServiceContext, rows: list[SetAside]) -> None:
    """Log and count the rows a round left out, so an admin can find and fix them."""
    set_aside.report(rows, counter=ctx.telemetry.set_aside_rows, log=log)


# SQLite has one writer: a rollup transaction holds it from agents' batches, so there the
# transactions are shorter and a pause between them lets a waiting batch in.
SQLITE_ROLLUP_LIMIT = 250
SQLITE_WRITER_PAUSE_SECONDS = 0.02


def rollup_once(
    ctx: ServiceContext, *, limit: int = 2_000, shard: tuple[int, int] | None = None
) -> int:
    """Recompute dirty rollup buckets until none are left, ``limit`` per transaction; with
    ``shard`` (index, count), only those of the GPUs whose id modulo count is index.

    Small transactions keep memory flat when a replayed spool leaves a large backlog.
    """
    sqlite = ctx.engine.dialect.name == "sqlite"
    if sqlite:
        limit = min(limit, SQLITE_ROLLUP_LIMIT)
    total = 0
    while True:
        found: list[SetAside] = []
        try:
            with ctx.engine.begin() as conn:
                n = _rollup_keys(ctx, conn, None, limit, found, shard)
        except Exception as exc:
            if is_outage(exc):
                raise
            found.clear()  # that transaction was rolled back: the one-by-one pass says them
            n = _rollup_one_by_one(ctx, limit, found, shard)
        report_set_aside(ctx, found)
        total += n
        ctx.telemetry.rollup_buckets.inc(n)
        if n < limit:
            break
        if sqlite:
            time.sleep(SQLITE_WRITER_PAUSE_SECONDS)
    return total


def _rollup_keys(
    ctx: ServiceContext,
    conn: Connection,
    keys: list[tuple[int, datetime]] | None,
    limit: int,
    found: list[SetAside],
    shard: tuple[int, int] | None = None,
) -> int:
    return rollup_repo.process_dirty(
        conn,
        thresholds=ctx.thresholds,
        limit=limit,
        split_rule=SplitRule(ctx.settings.cost_split_rule),
        keys=keys,
        set_aside=found,
        shard=shard,
    )


def _rollup_one_by_one(
    ctx: ServiceContext, limit: int, found: list[SetAside], shard: tuple[int, int] | None
) -> int:
    """The next ``limit`` dirty buckets (of ``shard``) each in a transaction of its own (a
    batch of them failed): one that still fails is set aside, so it cannot hold back the
    others."""
    with ctx.engine.connect() as conn:
        keys = rollup_repo.dirty_keys(conn, limit=limit, shard=shard)
    for gpu_id, bucket in keys:
        try:
            with ctx.engine.begin() as conn:
                _rollup_keys(ctx, conn, [(gpu_id, bucket)], limit, found)
        except Exception as exc:
            if is_outage(exc):
                raise
            with ctx.engine.begin() as conn:
                rollup_repo.discard_dirty(conn, [(gpu_id, bucket)])
            what = f"minute {bucket.isoformat()} of GPU {gpu_id}"
            found.append(SetAside("rollup", what, f"{type(exc).__name__}: {exc}"[:300]))
    return len(keys)


def retention_once(ctx: ServiceContext) -> dict[str, int]:
    """Enforce the retention settings once."""
    s = ctx.settings
    with ctx.engine.begin() as conn:
        return enforce_retention(
            conn,
            now=ctx.clock(),
            raw_days=s.retention_raw_days,
            minute_days=s.retention_1m_days,
            hour_days=s.retention_1h_days,
        )


def partitions_once(ctx: ServiceContext) -> list[str]:
    """Create today's and the next two days' sample partitions ahead of data (PostgreSQL only)."""
    if ctx.engine.dialect.name != "postgresql":
        return []
    today = ctx.clock().date()
    days = {today + timedelta(days=i) for i in range(3)}
    with ctx.engine.begin() as conn:
        created = partitions.ensure_partitions(conn, days)
    ctx.known_partitions |= days
    return created


def cost_days_once(ctx: ServiceContext) -> int:
    """Write the cost day sums that are missing or stale, for at most 10 s; returns GPU-days."""
    return cost_days.write_days(ctx.engine, settings=ctx.settings, clock=ctx.clock)


def today_sums_once(ctx: ServiceContext) -> int:
    """Write today's sums if they are missing or stale (a fleet just arrived, a restart);
    returns how many GPUs' rows (0 when they were current: a few counting queries)."""
    return cost_days.write_today_if_stale(ctx.engine, settings=ctx.settings, clock=ctx.clock)


def fleet_dollars_once(ctx: ServiceContext, cache: WastedTodayCache) -> bool:
    """Read the fleet page's dollars of today into ``cache`` once today's sums have moved;
    True if it read them."""
    with ctx.reads.connect(costs=True) as conn:
        return refresh_wasted_today(conn, settings=ctx.settings, now=ctx.clock(), cache=cache)


def observed_jobs_once(ctx: ServiceContext) -> int:
    """Close observed job-GPU intervals unseen for the grace period; returns how many."""
    with ctx.engine.begin() as conn:
        return observed_jobs_repo.close_unseen(
            conn, now=ctx.clock(), grace_seconds=ctx.settings.observed_job_grace_seconds
        )
