"""What the store holds as evidence for a ladder step: each of a job's open GPUs with where it
reports, who registered it, its newest sample and the minutes it reported in, and the clocks
of the nodes that registered the job."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select

from service.db.schema import gpus, nodes, samples
from service.thresholds.evidence import GpuEvidence, NodeClock

# A node's clock offset older than this is not read: it was measured before the node's agent
# was restarted or its clock set (a fresh batch measures it again within seconds).
CLOCK_OFFSET_VALID_SECONDS = 600.0


def job_evidence(
    conn: Connection, *, job: Mapping[str, Any], since: datetime, now: datetime
) -> tuple[list[GpuEvidence], list[NodeClock]]:
    """The evidence of ``job`` (get_job's row) for the time from ``since`` to ``now``."""
    open_ivs = [iv for iv in job.get("intervals", []) if iv["ended_at"] is None]
    uuids = sorted({iv["gpu_uuid"] for iv in open_ivs})
    if not uuids:
        return [], []
    rows = conn.execute(
        select(gpus.c.id, gpus.c.uuid, gpus.c.last_sample_at, nodes.c.hostname)
        .join(nodes, nodes.c.id == gpus.c.node_id)
        .where(gpus.c.uuid.in_(uuids))
    ).all()
    reported = _reported_minutes(conn, [r.id for r in rows], since=since, now=now)
    # The node that registered the job on each GPU (None: none is recorded, so no node's
    # samples speak for the job there).
    registered: dict[str, str | None] = {iv["gpu_uuid"]: iv["registered_node"] for iv in open_ivs}
    out = [
        GpuEvidence(
            uuid=r.uuid,
            node=r.hostname,
            registered_node=registered[r.uuid],
            last_sample_at=r.last_sample_at,
            reported_minutes=reported.get(r.id, frozenset()),
        )
        for r in rows
    ]
    return out, _clocks(conn, sorted({n for n in registered.values() if n}), now=now)


def _reported_minutes(
    conn: Connection, gpu_ids: Sequence[int], *, since: datetime, now: datetime
) -> dict[int, frozenset[datetime]]:
    """The minutes (their starts) from ``since``'s to ``now`` in which each GPU has a sample."""
    start = since.replace(second=0, microsecond=0)
    found: dict[int, set[datetime]] = {}
    q = select(samples.c.gpu_id, samples.c.ts).where(
        samples.c.gpu_id.in_(gpu_ids), samples.c.ts >= start, samples.c.ts <= now
    )
    for gpu_id, ts in conn.execute(q):
        found.setdefault(gpu_id, set()).add(ts.replace(second=0, microsecond=0))
    return {k: frozenset(v) for k, v in found.items()}


def _clocks(conn: Connection, hostnames: Sequence[str], *, now: datetime) -> list[NodeClock]:
    """The recent clock offsets of ``hostnames`` (None where none was measured lately)."""
    rows = conn.execute(
        select(nodes.c.hostname, nodes.c.clock_offset_seconds, nodes.c.clock_checked_at).where(
            nodes.c.hostname.in_(hostnames)
        )
    ).all()
    out = []
    for r in rows:
        fresh = (
            r.clock_checked_at is not None
            and (now - r.clock_checked_at).total_seconds() <= CLOCK_OFFSET_VALID_SECONDS
        )
        out.append(NodeClock(r.hostname, r.clock_offset_seconds if fresh else None))
    return out
