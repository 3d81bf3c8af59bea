"""Storing one ingest batch in one transaction: nodes, GPUs, samples, processes, dirty buckets."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, bindparam, or_, select, update

from service.db.dialect import insert_ignore
from service.db.schema import gpu_processes, gpus, nodes, rollup_dirty, samples
from service.errors import Forbidden, ValidationFailed
from service.vocabulary import METRIC_NAMES, ActivitySource
from service.wire import IngestBatch

BUCKET_SECONDS = 60


def minute_floor(ts: datetime) -> datetime:
    """``ts`` rounded down to its minute."""
    return ts.replace(second=0, microsecond=0)


def dirty_buckets(ts_values: Iterable[datetime], max_gap_seconds: float) -> set[datetime]:
    """The 1-minute buckets whose integrals a sample at each ts can change."""
    gap = timedelta(seconds=max_gap_seconds)
    out: set[datetime] = set()
    for ts in ts_values:
        b = minute_floor(ts - gap)
        last = minute_floor(ts + gap)
        while b <= last:
            out.add(b)
            b += timedelta(seconds=BUCKET_SECONDS)
    return out


def infer_source(metrics: dict[str, Any]) -> ActivitySource:
    """The activity source of a sample that did not say: SM activity means profiling data."""
    return ActivitySource.GPM if metrics.get("sm_active") is not None else ActivitySource.NVML


def upsert_node(conn: Connection, *, hostname: str, labels: dict[str, str], now: datetime) -> int:
    """The id of node ``hostname``, created if new; its labels and last-seen time are refreshed."""
    node_id = conn.execute(select(nodes.c.id).where(nodes.c.hostname == hostname)).scalar()
    if node_id is None:
        conn.execute(
            insert_ignore(conn, nodes, ["hostname"]).values(
                hostname=hostname, labels=labels, first_seen_at=now, last_seen_at=now
            )
        )
        node_id = conn.execute(select(nodes.c.id).where(nodes.c.hostname == hostname)).scalar_one()
    else:
        conn.execute(
            update(nodes).where(nodes.c.id == node_id).values(labels=labels, last_seen_at=now)
        )
    return int(node_id)


def store_batch(
    conn: Connection, *, batch: IngestBatch, now: datetime, max_gap_seconds: float
) -> dict[str, int]:
    """Store ``batch`` inside the caller's transaction; raises before writing anything bad."""
    node_id = upsert_node(conn, hostname=batch.node.hostname, labels=batch.node.labels, now=now)

    listed = {g.uuid: i for i, g in enumerate(batch.gpus)}
    wanted = (
        set(listed) | {s.gpu_uuid for s in batch.samples} | {p.gpu_uuid for p in batch.processes}
    )
    known = {
        r.uuid: r
        for r in conn.execute(
            select(
                gpus.c.id,
                gpus.c.uuid,
                gpus.c.node_id,
                gpus.c.gpu_index,
                gpus.c.model,
                gpus.c.fb_total_bytes,
                gpus.c.mig_parent_uuid,
                gpus.c.lost_at,
            ).where(gpus.c.uuid.in_(wanted))
        )
    }
    for uuid, row in known.items():
        if row.node_id != node_id:
            where = f"gpus[{listed[uuid]}].uuid" if uuid in listed else "gpu_uuid"
            raise Forbidden(f"{where}: GPU {uuid} belongs to another node")
    for i, s in enumerate(batch.samples):
        if s.gpu_uuid not in listed and s.gpu_uuid not in known:
            raise ValidationFailed(
                f"samples.{i}.gpu_uuid", f"unknown GPU {s.gpu_uuid}; list it in gpus"
            )
    for i, p in enumerate(batch.processes):
        if p.gpu_uuid not in listed and p.gpu_uuid not in known:
            raise ValidationFailed(
                f"processes.{i}.gpu_uuid", f"unknown GPU {p.gpu_uuid}; list it in gpus"
            )

    new_gpus: list[dict[str, Any]] = []
    changed: list[dict[str, Any]] = []
    for g in batch.gpus:
        attrs = {
            "gpu_index": g.index,
            "model": g.model,
            "fb_total_bytes": g.fb_total_bytes,
            "mig_parent_uuid": g.mig_parent_uuid,
        }
        known_row = known.get(g.uuid)
        if known_row is None:
            new_gpus.append(
                {
                    "uuid": g.uuid,
                    "node_id": node_id,
                    "first_seen_at": now,
                    "lost_at": now if g.lost else None,
                    **attrs,
                }
            )
            continue
        lost_at = (known_row.lost_at or now) if g.lost else None
        current = {k: getattr(known_row, k) for k in attrs} | {"lost_at": known_row.lost_at}
        if current != attrs | {"lost_at": lost_at}:
            changed.append(
                {"b_id": known_row.id}
                | {f"b_{k}": v for k, v in attrs.items()}
                | {"b_lost_at": lost_at}
            )
    if new_gpus:
        conn.execute(insert_ignore(conn, gpus, ["uuid"]), new_gpus)
    if changed:
        conn.execute(
            update(gpus)
            .where(gpus.c.id == bindparam("b_id"))
            .values({k[2:]: bindparam(k) for k in changed[0] if k != "b_id"}),
            changed,
        )
    ids = dict(conn.execute(select(gpus.c.uuid, gpus.c.id).where(gpus.c.uuid.in_(wanted))).all())

    if batch.samples:
        rows: list[dict[str, Any]] = []
        latest: dict[int, datetime] = {}
        for s in batch.samples:
            gpu_id = ids[s.gpu_uuid]
            ts = s.ts.astimezone(UTC)
            metrics = s.metrics.model_dump()
            sample_row = {name: metrics[name] for name in METRIC_NAMES}
            sample_row["gpu_id"] = gpu_id
            sample_row["ts"] = ts
            sample_row["source"] = (s.source or infer_source(metrics)).value
            rows.append(sample_row)
            if gpu_id not in latest or ts > latest[gpu_id]:
                latest[gpu_id] = ts
        conn.execute(insert_ignore(conn, samples, ["gpu_id", "ts"]), rows)
        per_gpu: dict[int, list[datetime]] = {}
        for r in rows:
            per_gpu.setdefault(r["gpu_id"], []).append(r["ts"])
        dirty = {
            (gpu_id, b)
            for gpu_id, stamps in per_gpu.items()
            for b in dirty_buckets(stamps, max_gap_seconds)
        }
        conn.execute(
            insert_ignore(conn, rollup_dirty, ["gpu_id", "bucket_start"]),
            [{"gpu_id": g, "bucket_start": b} for g, b in dirty],
        )
        conn.execute(
            update(gpus)
            .where(
                and_(
                    gpus.c.id == bindparam("b_id"),
                    or_(gpus.c.last_sample_at.is_(None), gpus.c.last_sample_at < bindparam("b_ts")),
                )
            )
            .values(last_sample_at=bindparam("b_ts")),
            [{"b_id": g, "b_ts": ts} for g, ts in latest.items()],
        )

    if batch.processes:
        conn.execute(
            insert_ignore(conn, gpu_processes, ["gpu_id", "ts", "pid"]),
            [
                {
                    "gpu_id": ids[p.gpu_uuid],
                    "ts": p.ts.astimezone(UTC),
                    "pid": p.pid,
                    "fb_used_bytes": p.fb_used_bytes,
                    "job_id": p.job_id,
                    "user": p.user,
                }
                for p in batch.processes
            ],
        )
    return {"samples": len(batch.samples), "processes": len(batch.processes), "gpus": len(ids)}
