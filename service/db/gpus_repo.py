"""Read queries over GPUs: the fleet list with latest values, and one GPU's time series."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple, cast

from sqlalchemy import Connection, and_, select

from service.core.diagnosis import Cause, Decision, Rung, memory_unknown, supported_causes
from service.costs.integrals import SIGNAL_METRICS
from service.db import holders_repo
from service.db.rows import GpuIndexRow, GpuMove, GpuRow
from service.db.schema import (
    gpu_moves,
    gpus,
    nodes,
    rollup_1h,
    rollup_1m,
    samples,
)
from service.vocabulary import HARDWARE_XIDS, METRIC_NAMES, clock_event_names, hw_slowdown

Resolution = Literal["raw", "1m", "1h"]


def fleet_index(conn: Connection, *, now: datetime, start_skew_seconds: float) -> list[GpuIndexRow]:
    """Every GPU's few fields a fleet view filters and sorts by (id, uuid, node, index, model,
    last-seen time, lost, latest cause, and the job holding it at ``now``), in node and index
    order: a page is chosen from these before any GPU's full row is read."""
    query = (
        select(
            gpus.c.id,
            gpus.c.uuid,
            gpus.c.gpu_index,
            gpus.c.model,
            gpus.c.last_sample_at,
            gpus.c.lost_at,
            nodes.c.hostname,
            gpus.c.last_cause,
        )
        .join(nodes, nodes.c.id == gpus.c.node_id)
        .order_by(nodes.c.hostname, gpus.c.gpu_index, gpus.c.uuid)
    )
    holders = holders_repo.holders_at(conn, now=now, start_skew_seconds=start_skew_seconds)
    out: list[GpuIndexRow] = []
    # fetchall and tuple unpacking: ten thousand rows fetched one by one cost a third more.
    for gpu_id, uuid, index, model, last_seen, lost_at, node, cause in conn.execute(query).all():
        held = holders.get(gpu_id)
        job = held[-1] if held else None
        out.append(
            {
                "gpu_id": gpu_id,
                "uuid": uuid,
                "index": index,
                "model": model,
                "node": node,
                "last_seen_at": last_seen,
                "lost": lost_at is not None,
                "cause": None if cause is None else _LABELS[cause],
                "job": job.job_id if job else None,
                "user": job.user if job else None,
                "team": job.team if job else None,
            }
        )
    return out


_LABELS = {int(c): c.label for c in Cause}


class LatestSignals(NamedTuple):
    """A GPU's latest sample as the state rule reads it: its decision and signal metrics."""

    decision: Decision
    values: dict[str, float | None]


def latest_signals(conn: Connection, *, gpu_ids: Collection[int]) -> dict[int, LatestSignals]:
    """The latest sample's decision and signal metrics (``SIGNAL_METRICS``) of each of
    ``gpu_ids`` that has a decided sample, in one statement."""
    if not gpu_ids:
        return {}
    cols = [samples.c[m] for m in SIGNAL_METRICS]
    query = (
        select(gpus.c.id, samples.c.activity, samples.c.activity_rung, samples.c.cause, *cols)
        .join(samples, and_(samples.c.gpu_id == gpus.c.id, samples.c.ts == gpus.c.last_sample_at))
        .where(gpus.c.id.in_(list(gpu_ids)))
    )
    out = {}
    for gpu_id, activity, rung, cause, *values in conn.execute(query).all():
        if activity is None or rung is None or cause is None:
            continue
        decision = Decision(activity, Rung(rung), Cause(cause))
        out[gpu_id] = LatestSignals(decision, dict(zip(SIGNAL_METRICS, values, strict=True)))
    return out


def list_gpus(
    conn: Connection,
    *,
    now: datetime,
    start_skew_seconds: float,
    node: str | None = None,
    model: str | None = None,
    gpu_ids: Collection[int] | None = None,
) -> list[GpuRow]:
    """Every GPU (only ``gpu_ids`` where given) with its node, model, last-seen time, the
    values of its latest sample and the job holding it at ``now`` (holders_repo's rule,
    ``start_skew_seconds`` its allowance), in node and index order."""
    query = (
        select(
            gpus.c.id.label("gpu_id_"),
            gpus.c.uuid,
            gpus.c.gpu_index,
            gpus.c.model,
            gpus.c.fb_total_bytes,
            gpus.c.mig_parent_uuid,
            gpus.c.first_seen_at,
            gpus.c.last_sample_at,
            gpus.c.lost_at,
            gpus.c.retired_at,
            nodes.c.hostname,
            nodes.c.labels,
            nodes.c.id.label("node_id_"),
            samples,
        )
        .join(nodes, nodes.c.id == gpus.c.node_id)
        .outerjoin(
            samples, and_(samples.c.gpu_id == gpus.c.id, samples.c.ts == gpus.c.last_sample_at)
        )
        .order_by(nodes.c.hostname, gpus.c.gpu_index, gpus.c.uuid)
    )
    if node is not None:
        query = query.where(nodes.c.hostname == node)
    if model is not None:
        query = query.where(gpus.c.model == model)
    if gpu_ids is not None:
        query = query.where(gpus.c.id.in_(list(gpu_ids)))
    rows = conn.execute(query).all()
    # A page's few GPUs ask only their nodes' holders, not the fleet's.
    node_ids = None if gpu_ids is None else {r.node_id_ for r in rows}
    holders = holders_repo.holders_at(
        conn, now=now, start_skew_seconds=start_skew_seconds, node_ids=node_ids
    )
    return [_gpu_row(r, holders) for r in rows]


def _gpu_row(r: Any, holders: Mapping[int, Sequence[holders_repo.Holder]]) -> GpuRow:
    """One row of ``list_gpus`` as the API has it."""
    latest = {m: getattr(r, m) for m in METRIC_NAMES if getattr(r, m) is not None}
    held = holders.get(r.gpu_id_)
    job = held[-1] if held else None
    return {
        "uuid": r.uuid,
        "index": r.gpu_index,
        "model": r.model,
        "node": r.hostname,
        "node_labels": r.labels,
        "fb_total_bytes": r.fb_total_bytes,
        "mig_parent_uuid": r.mig_parent_uuid,
        "first_seen_at": r.first_seen_at,
        "last_seen_at": r.last_sample_at,
        "lost": r.lost_at is not None,
        "retired_at": r.retired_at,
        "source": r.source,
        "latest": latest,
        "activity": r.activity,
        "activity_rung": None if r.activity_rung is None else Rung(r.activity_rung).label,
        "cause": None if r.cause is None else Cause(r.cause).label,
        "supported_causes": [c.label for c in supported_causes(latest)],
        "memory_unknown": memory_unknown(latest),
        "clock_event_reasons": clock_event_names(latest.get("clocks_event_reasons")),
        "hw_slowdown": hw_slowdown(latest.get("clocks_event_reasons")),
        "job": job.job_id if job else None,
        "user": job.user if job else None,
        "team": job.team if job else None,
    }


def gpu_id_by_uuid(conn: Connection, *, uuid: str) -> int | None:
    """The internal id of GPU ``uuid``, or None."""
    return conn.execute(select(gpus.c.id).where(gpus.c.uuid == uuid)).scalar()


def moves(conn: Connection, *, gpu_id: int) -> list[GpuMove]:
    """GPU ``gpu_id``'s moves between nodes, oldest first."""
    rows = conn.execute(
        select(
            gpu_moves.c.from_node,
            gpu_moves.c.to_node,
            gpu_moves.c.moved_at,
            gpu_moves.c.from_last_sample_at,
        )
        .where(gpu_moves.c.gpu_id == gpu_id)
        .order_by(gpu_moves.c.moved_at, gpu_moves.c.id)
    )
    return [cast(GpuMove, dict(r._mapping)) for r in rows]


def choose_resolution(step_seconds: float) -> Resolution:
    """The coarsest stored resolution that still has at least one row per step."""
    if step_seconds >= 3600:
        return "1h"
    if step_seconds >= 60:
        return "1m"
    return "raw"


class SeriesPoint(NamedTuple):
    """One step of a series: the step's start and the metric's avg, min, max and count in it."""

    ts: datetime
    avg: float
    min: float
    max: float
    sample_count: int


def series(
    conn: Connection,
    *,
    gpu_id: int,
    metric: str,
    start: datetime,
    end: datetime,
    step_seconds: float,
    resolution: Resolution,
) -> list[SeriesPoint]:
    """``metric`` of one GPU over [start, end) in steps of ``step_seconds``."""
    return series_many(
        conn,
        gpu_id=gpu_id,
        metrics=[metric],
        start=start,
        end=end,
        step_seconds=step_seconds,
        resolution=resolution,
    )[metric]


def series_many(
    conn: Connection,
    *,
    gpu_id: int,
    metrics: list[str],
    start: datetime,
    end: datetime,
    step_seconds: float,
    resolution: Resolution,
) -> dict[str, list[SeriesPoint]]:
    """Each of ``metrics`` of one GPU over [start, end) in steps of ``step_seconds``, read in
    one query (a row holds every metric; a metric's missing values are skipped)."""
    if resolution == "raw":
        cols = [samples.c[m] for m in metrics]
        query = select(samples.c.ts, *cols).where(
            samples.c.gpu_id == gpu_id, samples.c.ts >= start, samples.c.ts < end
        )
        # One raw sample is its own sum, min, max and a count of one.
        rows = ((ts, [(v, v, v, 1) for v in values]) for ts, *values in conn.execute(query))
    else:
        c = (rollup_1m if resolution == "1m" else rollup_1h).c
        fields = [c[f"{m}_{part}"] for m in metrics for part in ("sum", "min", "max", "count")]
        query = select(c.bucket_start, *fields).where(
            c.gpu_id == gpu_id, c.bucket_start >= start, c.bucket_start < end
        )
        rows = (
            (ts, [tuple(values[i : i + 4]) for i in range(0, len(values), 4)])
            for ts, *values in conn.execute(query)
        )
    accs: list[dict[float, list[float]]] = [{} for _ in metrics]
    for ts, parts in rows:
        epoch = ts.timestamp()
        key = epoch - epoch % step_seconds
        for acc, (total, lo, hi, count) in zip(accs, parts, strict=True):
            if total is None or not count:
                continue
            a = acc.get(key)
            if a is None:
                acc[key] = [total, lo, hi, count]
            else:
                a[0] += total
                a[1] = min(a[1], lo)
                a[2] = max(a[2], hi)
                a[3] += count
    return {
        m: [
            SeriesPoint(datetime.fromtimestamp(k, UTC), a[0] / a[3], a[1], a[2], int(a[3]))
            for k, a in sorted(acc.items())
        ]
        for m, acc in zip(metrics, accs, strict=True)
    }


class GpuFault(NamedTuple):
    """A hardware fault of one GPU: a hardware XID (``xid`` its code) at ``at``, or the GPU
    fell off the bus (``xid`` None): ``at`` its last sample, ``lost_at`` when it was reported."""

    gpu_id: int
    uuid: str
    node: str
    gpu_index: int
    xid: int | None
    at: datetime
    lost_at: datetime | None = None
    within_seconds: float = 0.0  # 0: ``at`` is the sample's time; 60, 3600: its rollup bucket


def gpu_faults(
    conn: Connection,
    *,
    gpu_ids: list[int],
    start: datetime,
    end: datetime,
    hourly_before: datetime | None = None,
) -> list[GpuFault]:
    """The hardware faults of the GPUs in [start, end]: each hardware XID code's first time per
    GPU (raw samples, else the 1m rollups' largest code per minute once raw samples are gone),
    and each GPU lost now whose last sample fell in the range; oldest first. With
    ``hourly_before`` the time before it is read from the 1h rollups only (a long report's
    window: the hour is then the time given), so a month is a few rows per GPU."""
    if not gpu_ids:
        return []
    who = {
        r.id: (r.uuid, r.hostname, r.gpu_index, r.lost_at, r.last_sample_at)
        for r in conn.execute(
            select(gpus.c.id, gpus.c.uuid, gpus.c.gpu_index, gpus.c.lost_at,
                   gpus.c.last_sample_at, nodes.c.hostname)
            .join(nodes, nodes.c.id == gpus.c.node_id)
            .where(gpus.c.id.in_(gpu_ids))
        )
    }  # fmt: skip
    codes = sorted(HARDWARE_XIDS)
    s, m, h = samples.c, rollup_1m.c, rollup_1h.c
    fine = start if hourly_before is None else max(start, hourly_before)
    raw = select(s.gpu_id, s.ts, s.xid_last).where(
        s.gpu_id.in_(gpu_ids), s.ts >= fine, s.ts <= end, s.xid_last.in_(codes)
    )
    minutes = select(m.gpu_id, m.bucket_start, m.xid_last_max).where(
        m.gpu_id.in_(gpu_ids), m.bucket_start >= fine, m.bucket_start <= end,
        m.xid_last_max.in_(codes),
    )  # fmt: skip
    reads = [(raw, 0.0), (minutes, 60.0)]
    if hourly_before is not None and start < hourly_before:
        hours = select(h.gpu_id, h.bucket_start, h.xid_last_max).where(
            h.gpu_id.in_(gpu_ids), h.bucket_start >= start, h.bucket_start < hourly_before,
            h.xid_last_max.in_(codes),
        )  # fmt: skip
        reads.insert(0, (hours, 3600.0))
    first: dict[tuple[int, int], tuple[datetime, float]] = {}
    for rows, within in ((conn.execute(q).all(), w) for q, w in reads):
        seen = set(first)
        for gpu_id, ts, code in rows:
            at = ts if ts.tzinfo else ts.replace(tzinfo=UTC)
            key = (gpu_id, int(code))
            # A minute's start is no time the XID came: it names a code raw samples did not.
            if (within != 60.0 or key not in seen) and (key not in first or at < first[key][0]):
                first[key] = (at, within)
    out = []
    for (gpu_id, code), (at, within) in first.items():
        uuid, node, index, _, _ = who[gpu_id]
        out.append(GpuFault(gpu_id, uuid, node, index, code, at, None, within))
    for gpu_id, (uuid, node, index, lost_at, last) in who.items():
        if lost_at is not None and last is not None and start <= last <= end:
            out.append(GpuFault(gpu_id, uuid, node, index, None, last, lost_at))
    return sorted(out, key=lambda f: (f.at, f.xid is None))
