"""Storing one ingest batch in one transaction: nodes, GPUs, samples, processes, dirty buckets."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, bindparam, case, insert, or_, select, update

from service.core.diagnosis import Thresholds, decide
from service.db import holders_repo
from service.db.dialect import bulk_insert, bulk_insert_ignore, copy_insert_ignore, insert_ignore
from service.db.schema import gpu_moves, gpu_processes, gpus, nodes, rollup_dirty, samples
from service.errors import Forbidden, ValidationFailed
from service.vocabulary import METRIC_NAMES, ActivitySource
from service.wire import GpuClaim, GpuIn, IngestBatch, ProcessIn

MINUTE = timedelta(minutes=1)
# The columns of a stored sample, in the order ingest writes them.
SAMPLE_COLUMNS = ("gpu_id", "ts", "source", *METRIC_NAMES, "activity", "activity_rung", "cause")
NODE_TOUCH_INTERVAL = timedelta(seconds=30)  # how stale nodes.last_seen_at may get
# How long a GPU's cached owner is believed: another central replica may have moved the GPU.
GPU_RECHECK_INTERVAL = timedelta(seconds=30)
# How long a (GPU, job, user) attributed by a batch is believed still observed: a job ended or
# an interval closed elsewhere (the API, another replica) is seen again within this long.
OBSERVED_RECHECK_INTERVAL = timedelta(seconds=60)
# (GPU, job, user) sightings remembered at most; past it the stale ones are dropped.
MAX_OBSERVED = 200_000


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


@dataclass(frozen=True, slots=True)
class GpuState:
    """A stored GPU as ingest last wrote or read it."""

    id: int
    node_id: int
    # (gpu_index, model, fb_total_bytes, mig_parent_uuid, lost, retired, pci_bus_id, driver)
    attrs: tuple[Any, ...]
    read_at: datetime  # when it was last read from the database


@dataclass
class IngestCache:
    """What ingest remembers between batches, so a steady agent costs little more than inserts.

    Only committed state goes in (see ``apply``): a rolled-back batch leaves it untouched.
    """

    nodes: dict[str, tuple[int, dict[str, str], datetime]] = field(default_factory=dict)
    gpus: dict[str, GpuState] = field(default_factory=dict)
    # (GPU uuid, job id, user) -> when a committed batch last made sure its job and interval.
    observed: dict[tuple[str, str, str | None], datetime] = field(default_factory=dict)

    def apply(self, pending: IngestCache) -> None:
        """Merge what a committed batch learned."""
        self.nodes.update(pending.nodes)
        self.gpus.update(pending.gpus)
        self.observed.update(pending.observed)
        if len(self.observed) > MAX_OBSERVED and pending.observed:
            newest = max(pending.observed.values())
            self.observed = {
                k: at for k, at in self.observed.items() if newest - at < OBSERVED_RECHECK_INTERVAL
            }

    def observed_lately(
        self, key: tuple[str, str, str | None], now: datetime, within: timedelta
    ) -> bool:
        """Whether a committed batch made sure of (GPU uuid, job id, user) ``key`` less than
        ``within`` before ``now``."""
        at = self.observed.get(key)
        return at is not None and timedelta(0) <= now - at < within

    def owned(self, uuid: str, node_id: int, now: datetime) -> GpuState | None:
        """The cached GPU ``uuid`` if node ``node_id`` owned it when last read, recently."""
        state = self.gpus.get(uuid)
        if state is None or state.node_id != node_id or now - state.read_at >= GPU_RECHECK_INTERVAL:
            return None
        return state


def _attrs(g: GpuIn) -> tuple[Any, ...]:
    return (
        g.index,
        g.model,
        g.fb_total_bytes,
        g.mig_parent_uuid,
        g.lost,
        g.retired,
        g.pci_bus_id,
        g.driver_version,
    )


def _node_id(
    conn: Connection,
    batch: IngestBatch,
    now: datetime,
    cache: IngestCache,
    pending: IngestCache,
    clock_offset_seconds: float | None,
) -> int:
    hostname, labels = batch.node.hostname, batch.node.labels
    cached = cache.nodes.get(hostname)
    if cached is not None and cached[1] == labels and now - cached[2] < NODE_TOUCH_INTERVAL:
        return cached[0]
    # The clock offset is measured as often as the node is touched (every 30 s at most).
    clock: dict[str, Any] = {}
    if clock_offset_seconds is not None:
        clock = {"clock_offset_seconds": clock_offset_seconds, "clock_checked_at": now}
    node_id = conn.execute(select(nodes.c.id).where(nodes.c.hostname == hostname)).scalar()
    if node_id is None:
        conn.execute(
            insert_ignore(conn, nodes, ["hostname"]).values(
                hostname=hostname, labels=labels, first_seen_at=now, last_seen_at=now, **clock
            )
        )
        node_id = conn.execute(select(nodes.c.id).where(nodes.c.hostname == hostname)).scalar_one()
    else:
        conn.execute(
            update(nodes)
            .where(nodes.c.id == node_id)
            .values(labels=labels, last_seen_at=now, **clock)
        )
    pending.nodes[hostname] = (int(node_id), dict(labels), now)
    return int(node_id)


def _read_states(conn: Connection, uuids: Iterable[str], now: datetime) -> dict[str, GpuState]:
    """The stored state of the GPUs with ``uuids`` that exist."""
    out = {}
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
            gpus.c.retired_at,
            gpus.c.pci_bus_id,
            gpus.c.driver_version,
        ).where(gpus.c.uuid.in_(list(uuids)))
    ):
        attrs = (
            r.gpu_index,
            r.model,
            r.fb_total_bytes,
            r.mig_parent_uuid,
            r.lost_at is not None,
            r.retired_at is not None,
            r.pci_bus_id,
            r.driver_version,
        )
        out[r.uuid] = GpuState(r.id, r.node_id, attrs, now)
    return out


def _wanted(batch: IngestBatch) -> set[str]:
    """Every GPU uuid the batch lists or refers to."""
    return (
        {g.uuid for g in batch.gpus}
        | {s.gpu_uuid for s in batch.samples}
        | {p.gpu_uuid for p in batch.processes}
    )


def _claim_gpus(
    conn: Connection,
    batch: IngestBatch,
    node_id: int,
    now: datetime,
    cache: IngestCache,
    move_after_seconds: float,
) -> tuple[IngestBatch, list[GpuClaim]]:
    """Settle the batch's GPUs that another node owns: move each to this node when its old node
    has not reported it for ``move_after_seconds``, else leave its items out of the batch.

    The token already proved the batch comes from this node; a GPU seen here and no longer
    there was moved (hardware moved, a node renamed). One still reported by both is two agents
    reading one GPU, which a move per batch would only make flap. MIG instances are held apart
    by their parent GPU (``_mig_claims``).
    """
    check = [u for u in _wanted(batch) if cache.owned(u, node_id, now) is None]
    if not check:
        return batch, []
    rows = conn.execute(
        select(gpus.c.id, gpus.c.uuid, gpus.c.last_sample_at, nodes.c.hostname)
        .join(nodes, nodes.c.id == gpus.c.node_id)
        .where(gpus.c.uuid.in_(check), gpus.c.node_id != node_id)
    ).all()
    here = batch.node.hostname
    claims, left_out = [], set()
    for r in rows:
        age = None if r.last_sample_at is None else (now - r.last_sample_at).total_seconds()
        if age is not None and age < move_after_seconds:
            left_out.add(r.uuid)
            claims.append(_left_out(r.uuid, r.hostname, here, age, move_after_seconds))
            continue
        conn.execute(update(gpus).where(gpus.c.id == r.id).values(node_id=node_id))
        conn.execute(
            insert(gpu_moves).values(
                gpu_id=r.id, from_node=r.hostname, to_node=here, moved_at=now,
                from_last_sample_at=r.last_sample_at,
            )
        )  # fmt: skip
        since = "" if age is None else f" (its last sample there {age:.0f} s ago)"
        why = f"GPU {r.uuid} moved from node {r.hostname!r} to {here!r}{since}"
        claims.append(GpuClaim(gpu_uuid=r.uuid, from_node=r.hostname, moved=True, reason=why))
    mig_out, mig_claims = _mig_claims(
        conn, batch, set(check) - left_out, node_id, now, move_after_seconds
    )
    return _without(batch, left_out | mig_out), claims + mig_claims


def _left_out(
    uuid: str, there: str, here: str, age: float, move_after_seconds: float, parent: str = ""
) -> GpuClaim:
    """The claim of GPU ``uuid`` left out of ``here``'s batch: node ``there`` reported it (or,
    for a MIG instance, an instance of its ``parent``) ``age`` seconds ago."""
    what = f"MIG instance {uuid}: its GPU {parent}" if parent else f"GPU {uuid}"
    return GpuClaim(gpu_uuid=uuid, from_node=there, moved=False, reason=(
        f"{what} is still reported by node {there!r} (its latest sample "
        f"{max(age, 0):.0f} s ago), so its items were left out of this batch: two "
        f"agents report one GPU (an agent reading another node's dcgm-exporter through "
        f"a Service needs internalTrafficPolicy: Local). It moves to {here!r} once "
        f"{there!r} has not reported it for {move_after_seconds:g} s"
    ))  # fmt: skip


def _mig_claims(
    conn: Connection,
    batch: IngestBatch,
    check: set[str],
    node_id: int,
    now: datetime,
    move_after_seconds: float,
) -> tuple[set[str], list[GpuClaim]]:
    """The batch's MIG instances (of ``check``) whose parent GPU another node reports, and
    their claims.

    An instance's uuid carries when the agent first saw it (service.collectors.mig), so two
    agents reading one exporter name each instance differently: the parent GPU is what they
    share. Of the nodes that reported an instance of a parent within ``move_after_seconds``,
    the one whose instance was stored first keeps it, so two nodes never both give way; the
    other's instances are left out until the keeper stops reporting.
    """
    parent_of = {
        g.uuid: p for g in batch.gpus if g.uuid in check and (p := g.mig_parent_uuid) is not None
    }
    parents = set(parent_of.values())
    if not parents:
        return set(), []
    recent = now - timedelta(seconds=move_after_seconds)
    keepers: dict[str, Any] = {}
    for r in conn.execute(
        select(gpus.c.mig_parent_uuid, gpus.c.node_id, gpus.c.last_sample_at, nodes.c.hostname)
        .join(nodes, nodes.c.id == gpus.c.node_id)
        .where(gpus.c.mig_parent_uuid.in_(parents), gpus.c.last_sample_at > recent)
        .order_by(gpus.c.id.desc())
    ):
        keepers[r.mig_parent_uuid] = r  # the lowest id last: the first stored
    out, claims = set(), []
    for uuid, parent in parent_of.items():
        keeper = keepers.get(parent)
        if keeper is None or keeper.node_id == node_id:
            continue
        out.add(uuid)
        age = (now - keeper.last_sample_at).total_seconds()
        here = batch.node.hostname
        claims.append(_left_out(uuid, keeper.hostname, here, age, move_after_seconds, parent))
    return out, claims


def _without(batch: IngestBatch, left_out: set[str]) -> IngestBatch:
    """``batch`` without the GPUs of ``left_out`` and their samples and processes."""
    if not left_out:
        return batch
    return batch.model_copy(
        update={
            "gpus": [g for g in batch.gpus if g.uuid not in left_out],
            "samples": [x for x in batch.samples if x.gpu_uuid not in left_out],
            "processes": [x for x in batch.processes if x.gpu_uuid not in left_out],
        }
    )


def _gpu_ids(
    conn: Connection,
    batch: IngestBatch,
    node_id: int,
    now: datetime,
    cache: IngestCache,
    pending: IngestCache,
    max_gap_seconds: float = 60.0,
) -> dict[str, int]:
    """The stored id of every GPU uuid the batch lists or refers to, after inserting the new
    GPUs and updating the changed ones; raises before writing if one is another node's or
    unknown."""
    wanted = _wanted(batch)
    # A GPU cached under another node may have just moved here: read it again.
    states = {u: st for u in wanted if (st := cache.owned(u, node_id, now)) is not None}
    unsure = [g for g in batch.gpus if g.uuid not in states or states[g.uuid].attrs != _attrs(g)]
    unsure_uuids = {g.uuid for g in unsure} | (wanted - set(states))
    if unsure_uuids:
        states.update(_read_states(conn, unsure_uuids, now))
    _check_gpus(batch, states, node_id)
    new_rows, changed = _gpu_writes(conn, batch, unsure, states, node_id, now, max_gap_seconds)
    if _write_gpus(conn, new_rows, changed):
        states.update(_read_states(conn, [g.uuid for g in unsure], now))
    for uuid, state in states.items():
        pending.gpus[uuid] = state
    return {uuid: state.id for uuid, state in states.items()}


def _write_gpus(
    conn: Connection, new_rows: list[dict[str, Any]], changed: list[dict[str, Any]]
) -> bool:
    """Insert ``new_rows`` into gpus and apply the ``changed`` updates; True if it wrote any."""
    if new_rows:
        conn.execute(insert_ignore(conn, gpus, ["uuid"]), new_rows)
    for row in changed:
        conn.execute(
            update(gpus)
            .where(gpus.c.id == bindparam("b_id"))
            .values({k[2:]: bindparam(k) for k in row if k != "b_id"}),
            row,
        )
    return bool(new_rows or changed)


def _check_gpus(batch: IngestBatch, states: dict[str, GpuState], node_id: int) -> None:
    """Raise if a stored GPU of the batch (``states``) belongs to another node, or if a sample
    or process names a GPU neither stored nor listed in the batch."""
    listed = {g.uuid: i for i, g in enumerate(batch.gpus)}
    for uuid, state in states.items():
        if state.node_id != node_id:
            where = f"gpus.{listed[uuid]}.uuid" if uuid in listed else "gpu_uuid"
            raise Forbidden(f"{where}: GPU {uuid} belongs to another node, which still reports it")
    referenced = [(f"samples.{i}", s.gpu_uuid) for i, s in enumerate(batch.samples)]
    referenced += [(f"processes.{i}", p.gpu_uuid) for i, p in enumerate(batch.processes)]
    for where, uuid in referenced:
        if uuid not in listed and uuid not in states:
            raise ValidationFailed(f"{where}.gpu_uuid", f"unknown GPU {uuid}; list it in gpus")


def _gpu_writes(
    conn: Connection,
    batch: IngestBatch,
    unsure: list[GpuIn],
    states: dict[str, GpuState],
    node_id: int,
    now: datetime,
    max_gap_seconds: float,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The gpus rows to insert for the GPUs of ``unsure`` not stored yet, and the updates
    (columns prefixed ``b_``, the id as ``b_id``) of those whose attributes changed."""
    # Times the batch speaks for, not when it arrived: a spool replayed (or a history shipped)
    # later must not make a GPU first seen after its samples, nor lost after its last one.
    first_sample: dict[str, datetime] = {}
    for smp in batch.samples:
        if smp.gpu_uuid not in first_sample or smp.ts < first_sample[smp.gpu_uuid]:
            first_sample[smp.gpu_uuid] = smp.ts
    batch_from = min(min(first_sample.values(), default=now), now)
    batch_until = min(max((smp.ts for smp in batch.samples), default=now), now)
    new_rows: list[dict[str, Any]] = []
    changed: list[dict[str, Any]] = []
    for g in unsure:
        known = states.get(g.uuid)
        values = {
            "gpu_index": g.index,
            "model": g.model,
            "fb_total_bytes": g.fb_total_bytes,
            "mig_parent_uuid": g.mig_parent_uuid,
            "pci_bus_id": g.pci_bus_id,
            "driver_version": g.driver_version,
        }
        if known is None:
            lost_at = batch_until if g.lost else None
            new_rows.append(
                {
                    "uuid": g.uuid,
                    "node_id": node_id,
                    "first_seen_at": min(first_sample.get(g.uuid, batch_from), now),
                    "lost_at": lost_at,
                    "retired_at": now if g.retired else None,
                    **values,
                }
            )
        elif known.attrs != _attrs(g):
            row = {"b_id": known.id, **{f"b_{k}": v for k, v in values.items()}}
            if g.lost != known.attrs[4]:
                # keep the first time a GPU was seen lost; clear it when the GPU is back
                row["b_lost_at"] = (
                    _lost_since(conn, batch, known.id, g.uuid, batch_until, max_gap_seconds)
                    if g.lost
                    else None
                )
            if g.retired != known.attrs[5]:
                row["b_retired_at"] = now if g.retired else None
            changed.append(row)
    return new_rows, changed


def _lost_since(
    conn: Connection,
    batch: IngestBatch,
    gpu_id: int,
    uuid: str,
    until: datetime,
    max_gap_seconds: float,
) -> datetime:
    """When a GPU just reported lost fell off: where its last sample (stored or in this batch)
    stops covering (``max_gap`` after it), at most ``until`` (the batch's latest sample). A
    replayed spool reports a loss long after it happened; the bill's lost time starts where
    the GPU's samples stop."""
    stored = conn.execute(select(gpus.c.last_sample_at).where(gpus.c.id == gpu_id)).scalar()
    times = [s.ts for s in batch.samples if s.gpu_uuid == uuid]
    if stored is not None:
        times.append(stored)
    if not times:
        return until
    return min(max(times) + timedelta(seconds=max_gap_seconds), until)


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


def store_batch(
    conn: Connection,
    *,
    batch: IngestBatch,
    now: datetime,
    thresholds: Thresholds,
    cache: IngestCache,
    pending: IngestCache,
    move_after_seconds: float = 60.0,
    clock_offset_seconds: float | None = None,
) -> dict[str, Any]:
    """Store ``batch`` in the caller's transaction; raises before writing anything bad.

    A GPU another node owns moves here if that node has not reported it for
    ``move_after_seconds``, else its items are left out; ``claims`` in the answer says which.

    Each sample is stored with its activity, rung and cause decided under ``thresholds``, so
    every reader uses that one decision.

    What it learns about nodes and GPUs goes to ``pending``; the caller applies that to
    ``cache`` after the transaction commits.
    """
    node_id = _node_id(conn, batch, now, cache, pending, clock_offset_seconds)
    batch, claims = _claim_gpus(conn, batch, node_id, now, cache, move_after_seconds)
    ids = _gpu_ids(conn, batch, node_id, now, cache, pending, thresholds.max_gap_seconds)
    taken, stored = _store_samples(conn, batch, ids, thresholds) if batch.samples else (0, 0)
    processes = _store_processes(conn, batch, ids)
    return {
        "samples": taken,
        "samples_new": stored,
        "processes": processes,
        "gpus": len(ids),
        "claims": claims,
    }


def _store_samples(
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


def _store_processes(conn: Connection, batch: IngestBatch, ids: dict[str, int]) -> int:
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
