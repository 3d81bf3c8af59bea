"""Retention: raw, 1-minute and 1-hour data each kept for their configured number of days."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Connection, delete

from service.db import partitions
from service.db.costing import cost_days_repo
from service.db.rollup_repo import delete_rollups_before
from service.db.schema import (
    gpu_processes,
    rollup_1h,
    rollup_1m,
    samples,
    shared_1h,
    tenant_1d,
    tenant_1h,
    tenant_1m,
)


def enforce_retention(
    conn: Connection, *, now: datetime, raw_days: float, minute_days: float, hour_days: float
) -> dict[str, int]:
    """Drop data past its retention; on PostgreSQL raw samples go a day partition at a time."""
    raw_cutoff = now - timedelta(days=raw_days)
    out: dict[str, int] = {}
    if conn.dialect.name == "postgresql":
        out["raw_partitions_dropped"] = len(partitions.drop_partitions_before(conn, raw_cutoff))
    else:
        res = conn.execute(delete(samples).where(samples.c.ts < raw_cutoff))
        out["raw_rows_deleted"] = int(res.rowcount or 0)
    res = conn.execute(delete(gpu_processes).where(gpu_processes.c.ts < raw_cutoff))
    out["process_rows_deleted"] = int(res.rowcount or 0)
    out["rollup_1m_deleted"] = delete_rollups_before(
        conn, table=rollup_1m, cutoff=now - timedelta(days=minute_days)
    )
    out["rollup_1h_deleted"] = delete_rollups_before(
        conn, table=rollup_1h, cutoff=now - timedelta(days=hour_days)
    )
    # Shared minutes are few and reports over 1h rollups still read them: kept as long.
    hour_cutoff = now - timedelta(days=hour_days)
    out["tenant_1m_deleted"] = delete_rollups_before(conn, table=tenant_1m, cutoff=hour_cutoff)
    # Their hourly and daily sums go once the whole hour (day) is past: a report reads a cut
    # hour by minutes, a cut day by hours.
    whole_hours = hour_cutoff.replace(minute=0, second=0, microsecond=0)
    whole_days = whole_hours.replace(hour=0)
    for table, cutoff in (
        (tenant_1h, whole_hours),
        (shared_1h, whole_hours),
        (tenant_1d, whole_days),
    ):
        out[f"{table.name}_deleted"] = delete_rollups_before(conn, table=table, cutoff=cutoff)
    # The cost day sums are kept as long as the hours they could be read from instead.
    out["cost_days_deleted"] = cost_days_repo.delete_days_before(conn, cutoff=whole_days)
    return out
