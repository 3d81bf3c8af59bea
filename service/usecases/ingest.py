"""Ingest: decode and validate a batch body, check it against the clock and store it whole."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection

from service.context import ServiceContext
from service.core.job_ids import job_id_problem
from service.db import ingest_repo, jobs_repo, observed_jobs_repo, partitions
from service.errors import Forbidden, Unavailable, ValidationFailed
from service.wire import GpuClaim, IngestBatch, IngestResult

log = logging.getLogger(__name__)

HINTS_SAID = 5  # ids a log line names of a batch's refused hints (a batch holds up to 10,000)
# An agent reading another node's exporter sends that node's GPUs in every batch: the refusal
# is counted each time (gpuwarden_ingest_gpus_refused) and logged once per this interval.
CLAIM_LOG_INTERVAL = timedelta(hours=1)
CLAIMS_REMEMBERED = 10_000  # (GPU, node) pairs kept before the ones logged long ago are dropped


def parse_batch(raw: bytes) -> IngestBatch:
    """Validate ``raw`` JSON against the wire contract (raises pydantic's ValidationError)."""
    return IngestBatch.model_validate_json(raw)


def check_times(
    batch: IngestBatch, *, now: datetime, max_future_seconds: float, oldest: datetime
) -> None:
    """Reject timestamps too far in the future or older than the raw retention, naming the item."""
    latest = now + timedelta(seconds=max_future_seconds)
    stamps = [(f"samples.{i}.ts", s.ts) for i, s in enumerate(batch.samples)]
    stamps += [(f"processes.{i}.ts", p.ts) for i, p in enumerate(batch.processes)]
    for field, ts in stamps:
        if ts > latest:
            raise ValidationFailed(
                field,
                f"{ts.isoformat()} is more than {max_future_seconds:g} s in the future "
                f"(server time {now.isoformat()})",
            )
        if ts < oldest:
            raise ValidationFailed(
                field,
                f"{ts.isoformat()} is older than the raw retention "
                f"(oldest accepted {oldest.isoformat()})",
            )


def clock_offset(sent_at: datetime | None, now: datetime) -> float | None:
    """The sender's clock minus the central's, in seconds (a Date header has whole seconds, so
    a clock in step reads between -1 and 0), or None without a send time."""
    return None if sent_at is None else (sent_at - now).total_seconds()


def check_node(batch: IngestBatch, *, token_node: str | None) -> None:
    """An agent token may only write batches for its own node."""
    if token_node is not None and batch.node.hostname != token_node:
        raise Forbidden(
            f"node.hostname: this token writes for node {token_node!r}, not {batch.node.hostname!r}"
        )


def without_bad_hints(batch: IngestBatch) -> IngestBatch:
    """``batch`` with each process's job hint that may not name a job (``slurm:0101``, which
    Slurm reads as job 101) cleared, logged once per batch; the processes and samples stay.

    Cleared, not refused: a 4xx dead-letters the agent's whole batch, and a hint comes from what
    a process says of itself (its environment), so refusing would let any user on a node throw
    away that node's samples. Control characters are refused at the wire instead: the agent
    never ships them (it drops such hints), so only a client that builds its own batch meets it.
    """
    bad = {
        job: problem
        for job in {p.job_id for p in batch.processes if p.job_id is not None}
        if (problem := job_id_problem(job)) is not None
    }
    if not bad:
        return batch
    said = sorted(bad.values())
    more = f"; and {len(said) - HINTS_SAID} more" if len(said) > HINTS_SAID else ""
    log.warning(
        "node %s: job hints left off %d process rows (no job opened or joined): %s%s",
        batch.node.hostname,
        sum(p.job_id in bad for p in batch.processes),
        "; ".join(said[:HINTS_SAID]),
        more,
    )
    processes = [
        p.model_copy(update={"job_id": None}) if p.job_id in bad else p for p in batch.processes
    ]
    return batch.model_copy(update={"processes": processes})


def _not_seen_lately(
    ctx: ServiceContext, batch: IngestBatch, *, now: datetime, pending: ingest_repo.IngestCache
) -> list[observed_jobs_repo.Seen]:
    """The batch's (GPU, job) sightings that this process has not made sure of lately (its job
    stored, its interval open), each noted in ``pending`` as made sure of at ``now``: a steady
    node's batches then cost no statement for its jobs."""
    within = min(
        ingest_repo.OBSERVED_RECHECK_INTERVAL,
        timedelta(seconds=ctx.settings.observed_job_grace_seconds / 2),
    )
    seen = observed_jobs_repo.summarise(
        (p.gpu_uuid, p.job_id, p.ts, p.user) for p in batch.processes
    )
    fresh = [
        s
        for s in seen
        if not ctx.ingest_cache.observed_lately((s.gpu_uuid, s.job_id, s.user), now, within)
    ]
    pending.observed.update(((s.gpu_uuid, s.job_id, s.user), now) for s in fresh)
    return fresh


def _record_disputed(
    ctx: ServiceContext,
    conn: Connection,
    disputed: list[observed_jobs_repo.Disputed],
    *,
    now: datetime,
) -> None:
    """Record (once per job, node and user) hints that named another node's job: a row on the
    job, an audit line and a count; their GPU time stays off that job."""
    for d in disputed:
        claimed = {"user": d.user}
        known = jobs_repo.conflicts_of(conn, job_id=d.job_id)
        if any(c["node"] == d.node and c["source"] == "observed" and c["claimed"] == claimed
               for c in known):  # fmt: skip
            continue
        jobs_repo.record_conflict(
            conn, job_id=d.job_id, node=d.node, source="observed", claimed=claimed, at=now
        )
        ctx.telemetry.job_conflicts.labels("observed").inc()
        job = jobs_repo.get_job(conn, job_id=d.job_id) or {"id": d.job_id}
        log.warning(
            "%s", jobs_repo.conflict_line(job, node=d.node, claimed=claimed, source="observed")
        )


def _log_refused(ctx: ServiceContext, claim: GpuClaim, *, node: str, now: datetime) -> None:
    """Log a GPU claim refused to ``node`` unless the same one was logged within the interval."""
    key = (claim.gpu_uuid, node, claim.from_node)
    last = ctx.claims_logged.get(key)
    if last is not None and timedelta(0) <= now - last < CLAIM_LOG_INTERVAL:
        return
    if len(ctx.claims_logged) >= CLAIMS_REMEMBERED:
        ctx.claims_logged = {
            k: at for k, at in ctx.claims_logged.items() if now - at < CLAIM_LOG_INTERVAL
        }
    ctx.claims_logged[key] = now
    log.info(
        "%s (said once an hour; each batch counted in gpuwarden_ingest_gpus_refused)", claim.reason
    )


def ingest(
    ctx: ServiceContext,
    batch: IngestBatch,
    *,
    token_node: str | None,
    given_up: Callable[[], str | None] = lambda: None,
    sent_at: datetime | None = None,
) -> IngestResult:
    """Validate ``batch`` against the clock and the caller, then store it in one transaction;
    rolled back (Unavailable, nothing stored) when ``given_up`` names why the client left.
    ``sent_at`` (the agent's clock when it sent, its Date header) measures the node's clock."""
    s = ctx.settings
    now = ctx.clock()
    check_node(batch, token_node=token_node)
    batch = without_bad_hints(batch)
    check_times(
        batch,
        now=now,
        max_future_seconds=s.ingest_max_future_seconds,
        oldest=now - timedelta(days=s.retention_raw_days),
    )
    engine = ctx.ingest_engine or ctx.engine
    if engine.dialect.name == "postgresql":
        days = {item.ts.astimezone(UTC).date() for item in batch.samples}
        missing = days - ctx.known_partitions
        if missing:
            with engine.begin() as conn:
                partitions.ensure_partitions(conn, missing)
            ctx.known_partitions |= missing
    pending = ingest_repo.IngestCache()
    with engine.begin() as conn:
        counts = ingest_repo.store_batch(
            conn,
            batch=batch,
            now=now,
            thresholds=ctx.thresholds,
            cache=ctx.ingest_cache,
            pending=pending,
            move_after_seconds=s.max_gap_seconds,
            clock_offset_seconds=clock_offset(sent_at, now),
        )
        # Jobs nobody registered appear from the processes the agents attributed.
        disputed: list[observed_jobs_repo.Disputed] = []
        observed_jobs_repo.observe(
            conn,
            seen=_not_seen_lately(ctx, batch, now=now, pending=pending),
            now=now,
            disputed=disputed,
        )
        refused = {d.job_id for d in disputed}
        if refused:  # asked again next batch, so each batch's conflict is recorded
            pending.observed = {k: at for k, at in pending.observed.items() if k[1] not in refused}
        _record_disputed(ctx, conn, disputed, now=now)
        # A client that gave up counts the batch as unsent and keeps it in its spool: storing it
        # behind its back is work done twice, under the load that made it give up.
        reason = given_up()
        if reason is not None:
            raise Unavailable(f"nothing stored: {reason}", retry_after_seconds=1)
    ctx.ingest_cache.apply(pending)
    claims: list[GpuClaim] = counts["claims"]
    for claim in claims:
        if claim.moved:
            log.warning("%s", claim.reason)
            ctx.telemetry.gpu_moves.inc()
        else:
            ctx.telemetry.ingest_gpus_refused.inc()
            _log_refused(ctx, claim, node=batch.node.hostname, now=now)
    return IngestResult(
        samples_received=counts["samples"],
        samples_stored=counts["samples_new"],
        processes_received=counts["processes"],
        gpus=counts["gpus"],
        gpu_claims=claims,
    )
