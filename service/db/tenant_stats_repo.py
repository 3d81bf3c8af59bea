"""Each job's own share of the cause metrics on the GPUs it shared, from tenant rows and rollups."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, func, select

from service.core.diagnosis import Cause
from service.costs.tenants import UNALLOCATED_TENANT
from service.db.schema import rollup_1m, tenant_1m
from service.db.windows_repo import WindowStatsByGpu
from service.thresholds.evaluator import WindowStats
from service.thresholds.policy import cause_of_metric

OwnStats = dict[tuple[str, int], dict[str, WindowStats]]


def tenant_cause_stats(
    conn: Connection,
    *,
    windows: Mapping[float, Iterable[str]],
    now: datetime,
    gpu_stats: Mapping[float, WindowStatsByGpu],
) -> dict[float, OwnStats]:
    """Per window, each job's own share of covered time in each cause metric on the GPUs it
    shared in that window, keyed by (``job:<id>``, GPU id).

    A shared GPU's cause is not its jobs' (one job's kernels keep it busy while another runs
    nothing), so these read the job's tenant rows for the shared minutes and the GPU's 1-minute
    rollups for its other minutes; both are written by the rollup job, so the last minute or
    two are not in yet. Each figure keeps the GPU's sample count (``gpu_stats``), so it weighs
    as much as the GPU's own figure would among the job's GPUs.
    """
    out: dict[float, OwnStats] = {}
    for w, ms in windows.items():
        causes = {
            m: c
            for m in set(ms)
            if (c := Cause.IDLE_HELD if m == "idle_held" else cause_of_metric(m))
        }
        if not causes:
            continue
        since = now - timedelta(seconds=w)
        fields = {m: f"{c.label}_seconds" for m, c in causes.items()}
        t = tenant_1m.c
        tenant_rows = conn.execute(
            select(
                t.tenant,
                t.gpu_id,
                func.sum(t.covered_seconds),
                *(func.sum(t[f]) for f in fields.values()),
            )
            .where(t.bucket_start >= since, t.bucket_start < now, t.tenant != UNALLOCATED_TENANT)
            .group_by(t.tenant, t.gpu_id)
        ).all()
        if not tenant_rows:
            continue
        gpu_ids = sorted({int(row[1]) for row in tenant_rows})
        alone = _unshared_seconds(conn, fields, gpu_ids, since, now)
        out[w] = _own_shares(tenant_rows, alone, fields, gpu_stats.get(w, {}))
    return out


def _unshared_seconds(
    conn: Connection, fields: Mapping[str, str], gpu_ids: list[int], since: datetime, now: datetime
) -> dict[int, Any]:
    """Per GPU of ``gpu_ids``, its covered seconds then each of ``fields`` summed over its
    1-minute rollups in [``since``, ``now``) that no tenant rows split."""
    r = rollup_1m.c
    shared_minute = (
        select(tenant_1m.c.gpu_id)
        .where(tenant_1m.c.gpu_id == r.gpu_id, tenant_1m.c.bucket_start == r.bucket_start)
        .exists()
    )
    return {
        row[0]: row[1:]
        for row in conn.execute(
            select(
                r.gpu_id,
                func.sum(r.covered_seconds),
                *(func.sum(r[f]) for f in fields.values()),
            )
            .where(
                r.gpu_id.in_(gpu_ids),
                r.bucket_start >= since,
                r.bucket_start < now,
                ~shared_minute,
            )
            .group_by(r.gpu_id)
        )
    }


def _own_shares(
    tenant_rows: Iterable[Any],
    alone: Mapping[int, Any],
    fields: Mapping[str, str],
    gpu_stats: WindowStatsByGpu,
) -> OwnStats:
    """Each job's share of covered time in each cause metric of ``fields`` on each GPU, from
    its tenant seconds (``tenant_rows``) plus the GPU's unshared ones (``alone``), weighted by
    the GPU's sample count in ``gpu_stats``."""
    own: OwnStats = {}
    for tenant, gpu_id, covered, *seconds in tenant_rows:
        rest = alone.get(gpu_id)
        cov = float(covered or 0.0) + float((rest[0] if rest else 0.0) or 0.0)
        if cov <= 0:
            continue
        per: dict[str, WindowStats] = {}
        for k, m in enumerate(fields):
            e = float(seconds[k] or 0.0) + float((rest[k + 1] if rest else 0.0) or 0.0)
            ratio = e / cov
            gpu_stat = gpu_stats.get(gpu_id, {}).get(m)
            n = gpu_stat.count if gpu_stat is not None and gpu_stat.count else 1
            per[m] = WindowStats(ratio * n, n, ratio, ratio)
        own[(f"job:{tenant}", int(gpu_id))] = per
    return own
