"""Reads for /metrics: the latest sample of every recently reporting GPU, lost GPUs and prices."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Select, and_, func, select

from service.db import holders_repo
from service.db.holders_repo import Holder
from service.db.schema import gpus, ladder_actions, nodes, samples
from service.exposition.shards import Shard
from service.exposition.types import FleetGpu, FleetSnapshot, LostGpu
from service.vocabulary import METRIC_NAMES


def shard_node_ids(conn: Connection, *, shard: Shard) -> list[int]:
    """The ids of the nodes whose GPUs ``shard`` holds."""
    rows = conn.execute(select(nodes.c.id, nodes.c.hostname))
    return [node_id for node_id, hostname in rows if shard.holds(hostname)]


def read_fleet(
    conn: Connection,
    *,
    now: datetime,
    max_age_seconds: float,
    start_skew_seconds: float,
    node_ids: Collection[int] | None = None,
) -> FleetSnapshot:
    """GPUs whose latest sample is at most ``max_age_seconds`` old, with the job holding each
    at ``now`` (holders_repo's rule, ``start_skew_seconds`` its allowance); only those of
    ``node_ids`` when given."""
    fresh_since = now - timedelta(seconds=max_age_seconds)
    held = holders_repo.holders_at(
        conn, now=now, start_skew_seconds=start_skew_seconds, node_ids=node_ids
    )
    query = _latest_samples(fresh_since)
    if node_ids is not None:
        query = query.where(gpus.c.node_id.in_(node_ids))
    readings = [_fleet_gpu(row, held.get(row[0])) for row in conn.execute(query)]
    lost = _lost_gpus(conn, fresh_since, node_ids, held)
    return FleetSnapshot(readings=readings, lost=lost)


def _latest_samples(fresh_since: datetime) -> Select[Any]:
    """Every GPU's latest sample, if taken at ``fresh_since`` or later, with its node's name:
    the columns _fleet_gpu reads, in its order."""
    return (
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
            samples.c.activity,
            samples.c.activity_rung,
            samples.c.cause,
            gpus.c.pci_bus_id,
            gpus.c.driver_version,
            *(samples.c[m] for m in METRIC_NAMES),
        )
        .join(nodes, nodes.c.id == gpus.c.node_id)
        .join(samples, and_(samples.c.gpu_id == gpus.c.id, samples.c.ts == gpus.c.last_sample_at))
        .where(gpus.c.last_sample_at >= fresh_since)
    )


def _fleet_gpu(row: Sequence[Any], holders: Sequence[Holder] | None) -> FleetGpu:
    """A row of _latest_samples as a FleetGpu, held by the latest-started of ``holders``."""
    _, uuid, index, model, fb_total, mig_parent, last_at, hostname, source = row[:9]
    activity, rung, cause, pci_bus_id, driver_version = row[9:14]
    values = {name: v for name, v in zip(METRIC_NAMES, row[14:], strict=True) if v is not None}
    # A GPU shared by several jobs shows the latest-started one.
    job = holders[-1] if holders else None
    return FleetGpu(
        node=hostname,
        index=index,
        uuid=uuid,
        model=model,
        last_sample_at=last_at,
        values=values,
        source=source,
        fb_total_bytes=fb_total,
        mig_parent_uuid=mig_parent,
        pci_bus_id=pci_bus_id,
        driver_version=driver_version,
        job_id=job.job_id if job else None,
        user=job.user if job else None,
        team=job.team if job else None,
        project=job.project if job else None,
        activity=activity,
        rung=rung,
        cause=cause,
    )


def _lost_gpus(
    conn: Connection,
    fresh_since: datetime,
    node_ids: Collection[int] | None,
    held: Mapping[int, Sequence[Holder]],
) -> list[LostGpu]:
    """GPUs lost and not retired, of nodes seen at ``fresh_since`` or later (of ``node_ids``
    when given), by node and index, each with the latest-started of its holders (``held``)."""
    query = (
        select(gpus.c.id, nodes.c.hostname, gpus.c.gpu_index, gpus.c.uuid, gpus.c.model)
        .join(nodes, nodes.c.id == gpus.c.node_id)
        .where(
            gpus.c.lost_at.is_not(None),
            gpus.c.retired_at.is_(None),
            nodes.c.last_seen_at >= fresh_since,
        )
        .order_by(nodes.c.hostname, gpus.c.gpu_index)
    )
    if node_ids is not None:
        query = query.where(nodes.c.id.in_(node_ids))
    out = []
    for r in conn.execute(query):
        holders = held.get(r.id)
        job = holders[-1] if holders else None
        out.append(
            LostGpu(
                node=r.hostname,
                index=r.gpu_index,
                uuid=r.uuid,
                model=r.model,
                job_id=job.job_id if job else None,
                user=job.user if job else None,
                team=job.team if job else None,
                project=job.project if job else None,
            )
        )
    return out


def node_last_seen(
    conn: Connection, *, since: datetime, node_ids: Collection[int] | None = None
) -> dict[str, datetime]:
    """When each node seen since ``since`` (of ``node_ids`` when given) last reported: its
    latest batch or GPU sample.

    ``nodes.last_seen_at`` is touched at most every 30 s (ingest_repo), a GPU's latest sample
    every batch; the later of the two is the node's last sign of life.
    """
    latest_sample = func.max(gpus.c.last_sample_at)
    query = (
        select(nodes.c.hostname, nodes.c.last_seen_at, latest_sample)
        .select_from(nodes)
        .outerjoin(gpus, and_(gpus.c.node_id == nodes.c.id, gpus.c.retired_at.is_(None)))
        .where(nodes.c.last_seen_at >= since)
        .group_by(nodes.c.id, nodes.c.hostname, nodes.c.last_seen_at)
    )
    if node_ids is not None:
        query = query.where(nodes.c.id.in_(node_ids))
    rows = conn.execute(query)
    return {host: max(seen, sample or seen) for host, seen, sample in rows}


def node_clock_offsets(
    conn: Connection, *, since: datetime, node_ids: Collection[int] | None = None
) -> dict[str, float]:
    """Each node's clock minus the central's (seconds), where measured since ``since`` (of
    ``node_ids`` when given)."""
    query = select(nodes.c.hostname, nodes.c.clock_offset_seconds).where(
        nodes.c.clock_checked_at >= since, nodes.c.clock_offset_seconds.is_not(None)
    )
    if node_ids is not None:
        query = query.where(nodes.c.id.in_(node_ids))
    return {host: float(offset) for host, offset in conn.execute(query)}


def count_actions(conn: Connection) -> list[tuple[str, str, str, int]]:
    """(policy, action, outcome, rows) over the whole audit log of the ladders."""
    t = ladder_actions
    q = select(t.c.policy, t.c.action, t.c.outcome, func.count()).group_by(
        t.c.policy, t.c.action, t.c.outcome
    )
    return [(p, a, o, int(n)) for p, a, o, n in conn.execute(q)]
