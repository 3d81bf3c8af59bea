"""Storing an ingest batch's samples and processes: each sample's decision, dirty minutes, spans."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, bindparam, case, or_, update

from service.core.diagnosis import Thresholds, decide
from service.db import holders_repo
from service.db.dialect import bulk_insert, bulk_insert_ignore, copy_insert_ignore
from service.db.schema import gpu_processes, gpus, rollup_dirty, samples
from service.vocabulary import METRIC_NAMES, ActivitySource
from service.wire import IngestBatch, ProcessIn

MINUTE = timedelta(minutes=1)
# The columns of a stored sample, in the order ingest writes them.
SAMPLE_COLUMNS = ("gpu_id", "ts", "source", *METRIC_NAMES, "activity", "activity_rung", "cause")


def minute_floor(ts: datetime) -> datetime:
    """``ts`` rounded down to its minute."""
    return ts.replace(second=0, microsecond=0)


def dirty_range(first: datetime, last: datetime, max_gap_seconds: float) -> list[datetime]:
    """The 1-minute buckets whose integrals samples between ``first`` and ``last`` can change."""
    gap = timedelta(seconds=max_gap_seconds)
    b, end = minute_floor(first - gap), minute_floor(last + gap)
    out = []
    while b <= end:
        out.append(b)
        b += MINUTE
    return out


def infer_source(metrics: dict[str, Any]) -> ActivitySource:
    """The activity source of a sample that did not say: SM activity means profiling data."""
    return ActivitySource.GPM if metrics.get("sm_active") is not None else ActivitySource.NVML


# Later than the stored last sample, or earlier than the stored first: the row moves.
_LATER = "(gpus.last_sample_at IS NULL OR gpus.last_sample_at < v.ts)"
_EARLIER = "(gpus.first_sample_at IS NULL OR gpus.first_sample_at > v.lo)"
_ADVANCE_PG = (
    f"UPDATE gpus SET last_sample_at = CASE WHEN {_LATER} THEN v.ts ELSE gpus.last_sample_at END, "
    f"last_cause = CASE WHEN {_LATER} THEN v.cause ELSE gpus.last_cause END, "
    f"first_sample_at = CASE WHEN {_EARLIER} THEN v.lo ELSE gpus.first_sample_at END "
    "FROM json_to_recordset(%s::json) AS v(id integer, lo timestamptz, ts timestamptz, "
    f"cause smallint) WHERE gpus.id = v.id AND ({_LATER} OR {_EARLIER})"
)


@dataclass(frozen=True, slots=True)
class SampledSpan:
    """A GPU's samples in a batch: the earliest's time, the latest's and the latest's cause."""

    first: datetime
    last: datetime
    last_cause: int | None


def _advance_sampled(conn: Connection, spans: dict[int, SampledSpan]) -> None:
    """Move each GPU's last_sample_at and last_cause forward to its span's latest sample, and
    its first_sample_at back to its span's first, never the other way."""
    if conn.dialect.name == "postgresql":
        # one statement for all GPUs rather than one UPDATE per GPU
        payload = json.dumps(
            [
                {"id": g, "lo": s.first.isoformat(), "ts": s.last.isoformat(),
                 "cause": s.last_cause}
                for g, s in spans.items()
            ]
        )  # fmt: skip
        conn.exec_driver_sql(_ADVANCE_PG, (payload,))
        return
    g = gpus.c
    later = or_(g.last_sample_at.is_(None), g.last_sample_at < bindparam("b_ts"))
    earlier = or_(g.first_sample_at.is_(None), g.first_sample_at > bindparam("b_lo"))
    conn.execute(
        update(gpus)
        .where(and_(g.id == bindparam("b_id"), or_(later, earlier)))
        .values(
            last_sample_at=case((later, bindparam("b_ts")), else_=g.last_sample_at),
            last_cause=case((later, bindparam("b_cause")), else_=g.last_cause),
            first_sample_at=case((earlier, bindparam("b_lo")), else_=g.first_sample_at),
        ),
        [
            {"b_id": g, "b_lo": s.first, "b_ts": s.last, "b_cause": s.last_cause}
            for g, s in spans.items()
        ],
    )


def _holders_numbered(processes: Sequence[ProcessIn]) -> list[ProcessIn]:
    """The batch's processes with the holder rows (pid 0: a job holds the GPU, no process of it
    is listed) of each (GPU, ts) stored as pids 0, -1, -2, ... in job order, so every job of a
    GPU several jobs share keeps its row; the wire never carries a negative pid."""
    holders: dict[tuple[str, datetime], set[str]] = {}
    out: list[ProcessIn] = []
    for p in processes:
        if p.pid == 0 and p.job_id is not None:
            holders.setdefault((p.gpu_uuid, p.ts), set())
            if p.job_id not in holders[(p.gpu_uuid, p.ts)]:
                holders[(p.gpu_uuid, p.ts)].add(p.job_id)
                out.append(p)
        else:
            out.append(p)
    if not any(len(jobs) > 1 for jobs in holders.values()):
        return out
    rank = {
        (uuid, ts, job): -i
        for (uuid, ts), jobs in holders.items()
        for i, job in enumerate(sorted(jobs))
    }
    return [
        p.model_copy(update={"pid": rank[(p.gpu_uuid, p.ts, p.job_id)]})
        if p.pid == 0 and p.job_id is not None
        else p
        for p in out
    ]


def store_samples(
    conn: Connection, batch: IngestBatch, ids: dict[str, int], thresholds: Thresholds
) -> tuple[int, int]:
    """Insert the batch's samples, each with its decision under ``thresholds``, mark their
    minutes dirty and advance the GPUs' last sample; returns (samples taken, rows new)."""
    seen: set[tuple[int, datetime]] = set()
    rows: list[tuple[Any, ...]] = []
    spans: dict[int, SampledSpan] = {}
    # A process listed at a sample's time holds the GPU even below the held threshold; a
    # holder row (pid 0: a job holds the GPU, no process of it is listed) is no process, but
    # where memory is not reported it is the job that holds the GPU (``_held_by_jobs``).
    listed = {(p.gpu_uuid, p.ts) for p in batch.processes if p.pid > 0}
    jobbed = _held_by_jobs(conn, batch, ids)
    for s in batch.samples:
        gpu_id = ids[s.gpu_uuid]
        ts = s.ts.astimezone(UTC)
        if (gpu_id, ts) in seen:
            continue  # the first of a repeated (GPU, ts) wins, as a resent batch's would
        seen.add((gpu_id, ts))
        metrics = s.metrics.__dict__  # every field, None when absent; no copy
        key = (s.gpu_uuid, s.ts)
        d = decide(metrics, thresholds, has_process=key in listed, has_job=key in jobbed)
        decision = (None, None, None) if d is None else (d.activity, int(d.rung), int(d.cause))
        source = (s.source or infer_source(metrics)).value
        rows.append((gpu_id, ts, source, *[metrics[m] for m in METRIC_NAMES], *decision))
        span = spans.get(gpu_id)
        if span is None or ts > span.last:
            spans[gpu_id] = SampledSpan(span.first if span else ts, ts, decision[2])
        elif ts < span.first:
            spans[gpu_id] = SampledSpan(ts, span.last, span.last_cause)
    stored = copy_insert_ignore(conn, samples, ["gpu_id", "ts"], SAMPLE_COLUMNS, rows)
    bulk_insert(
        conn,
        rollup_dirty,
        [
            {"gpu_id": gpu_id, "bucket_start": b}
            for gpu_id, span in spans.items()
            for b in dirty_range(span.first, span.last, thresholds.max_gap_seconds)
        ],
    )
    _advance_sampled(conn, spans)
    return len(seen), stored


def _held_by_jobs(
    conn: Connection, batch: IngestBatch, ids: dict[str, int]
) -> set[tuple[str, datetime]]:
    """The (GPU uuid, ts) of the batch's samples without a memory figure that a job holds: a
    process row of the batch names its job, or a job's interval covers the sample.

    Only these need it: with a memory figure, memory decides whether an idle GPU is held.
    """
    blind = [s for s in batch.samples if s.metrics.__dict__["fb_used_bytes"] is None]
    if not blind:
        return set()
    out = {(p.gpu_uuid, p.ts) for p in batch.processes if p.job_id is not None}
    rest = [s for s in blind if (s.gpu_uuid, s.ts) not in out]
    if not rest:
        return out
    spans = holders_repo.held_spans(
        conn,
        gpu_ids={ids[s.gpu_uuid] for s in rest},
        start=min(s.ts for s in rest),
        end=max(s.ts for s in rest),
    )
    for s in rest:
        if any(a <= s.ts and (b is None or s.ts < b) for a, b in spans.get(ids[s.gpu_uuid], ())):
            out.add((s.gpu_uuid, s.ts))
    return out


def store_processes(conn: Connection, batch: IngestBatch, ids: dict[str, int]) -> int:
    """Insert the batch's processes (one per GPU, ts and pid; holder rows numbered by
    ``_holders_numbered``); returns how many it took."""
    procs: dict[tuple[int, datetime, int], dict[str, Any]] = {}
    for p in _holders_numbered(batch.processes):
        key = (ids[p.gpu_uuid], p.ts.astimezone(UTC), p.pid)
        if key not in procs:
            procs[key] = {
                "gpu_id": key[0],
                "ts": key[1],
                "pid": p.pid,
                "fb_used_bytes": p.fb_used_bytes,
                "job_id": p.job_id,
                "user": p.user,
                "sm_util": p.sm_util,
                "mem_util": p.mem_util,
                "host_cpu_seconds": p.host_cpu_seconds,
                "host_read_bytes": p.host_read_bytes,
                "host_write_bytes": p.host_write_bytes,
                "host_voluntary_switches": p.host_voluntary_switches,
                "host_children": p.host_children,
            }
    if procs:
        bulk_insert_ignore(conn, gpu_processes, ["gpu_id", "ts", "pid"], list(procs.values()))
    return len(procs)
