"""Background jobs (rollups, retention, partitions); a failing run is logged and counted."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobSubmissionEvent
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import Connection

from service.context import ServiceContext
from service.costs.tenants import SplitRule
from service.db import observed_jobs_repo, partitions, rollup_repo, set_aside
from service.db.leader import job_turn
from service.db.outages import OutageLog, is_outage
from service.db.retention import enforce_retention
from service.db.set_aside import SetAside

log = logging.getLogger(__name__)
_OUTAGES = OutageLog(log, "background jobs retry on their next tick")


class _SkippedRunFilter(logging.Filter):
    """Drops APScheduler's "skipped: maximum number of running instances" warnings.

    A job still busy when its next tick comes (the outbox draining a backlog to a slow channel)
    is skipped on every tick; that is counted (gpuwarden_background_job_runs_total with outcome
    "skipped"), not logged once a second.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "maximum number of running instances" not in str(record.msg)


logging.getLogger("apscheduler.scheduler").addFilter(_SkippedRunFilter())


# What a job returns when another replica holds its turn (counted as skipped).
ELSEWHERE = object()


def one_replica_at_a_time(
    ctx: ServiceContext, name: str, fn: Callable[[], object]
) -> Callable[[], object]:
    """``fn`` run only while no other replica runs job ``name`` (the PostgreSQL advisory lock of
    ``job_turn``); else it returns ``ELSEWHERE``. Rollups and retention rewrite shared rows:
    two replicas doing one's work at once would only contend."""

    def run() -> object:
        with job_turn(ctx.engine, name) as mine:
            return fn() if mine else ELSEWHERE

    return run


def run_job(ctx: ServiceContext, name: str, fn: Callable[[], object]) -> object:
    """Run ``fn`` as background job ``name``: time it, count the outcome, never raise."""
    started = time.perf_counter()
    try:
        result = fn()
        if result is ELSEWHERE:
            ctx.telemetry.job_runs.labels(name, "skipped").inc()
            return None
    except Exception as exc:
        if is_outage(exc):
            _OUTAGES.failed(exc, f"background job {name}")  # one line, not one per tick
        else:
            log.exception("background job %s failed", name)
        ctx.telemetry.job_runs.labels(name, "error").inc()
        ctx.telemetry.db_errors.labels(name).inc()
        return None
    finally:
        ctx.telemetry.job_seconds.labels(name).observe(time.perf_counter() - started)
    ctx.telemetry.job_runs.labels(name, "ok").inc()
    return result


def report_set_aside(ctx: ServiceContext, rows: list[SetAside]) -> None:
    """Log and count the rows a round left out, so an admin can find and fix them."""
    set_aside.report(rows, counter=ctx.telemetry.set_aside_rows, log=log)


# SQLite has one writer: a rollup transaction holds it from agents' batches, so there the
# transactions are shorter and a pause between them lets a waiting batch in.
SQLITE_ROLLUP_LIMIT = 250
SQLITE_WRITER_PAUSE_SECONDS = 0.02


def rollup_once(ctx: ServiceContext, *, limit: int = 2_000) -> int:
    """Recompute dirty rollup buckets until none are left, ``limit`` per transaction.

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
                n = _rollup_keys(ctx, conn, None, limit, found)
        except Exception as exc:
            if is_outage(exc):
                raise
            found.clear()  # that transaction was rolled back: the one-by-one pass says them
            n = _rollup_one_by_one(ctx, limit, found)
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
) -> int:
    return rollup_repo.process_dirty(
        conn,
        thresholds=ctx.thresholds,
        limit=limit,
        split_rule=SplitRule(ctx.settings.cost_split_rule),
        keys=keys,
        set_aside=found,
    )


def _rollup_one_by_one(ctx: ServiceContext, limit: int, found: list[SetAside]) -> int:
    """The next ``limit`` dirty buckets each in a transaction of its own (a batch of them
    failed): one that still fails is set aside, so it cannot hold back the others."""
    with ctx.engine.connect() as conn:
        keys = rollup_repo.dirty_keys(conn, limit=limit)
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
    from service.usecases import cost_days

    return cost_days.write_days(ctx.engine, settings=ctx.settings, clock=ctx.clock)


def observed_jobs_once(ctx: ServiceContext) -> int:
    """Close observed job-GPU intervals unseen for the grace period; returns how many."""
    with ctx.engine.begin() as conn:
        return observed_jobs_repo.close_unseen(
            conn, now=ctx.clock(), grace_seconds=ctx.settings.observed_job_grace_seconds
        )


def build_scheduler(ctx: ServiceContext) -> BackgroundScheduler:
    """A scheduler with the storage jobs; the caller starts and stops it."""
    s = ctx.settings
    sched = BackgroundScheduler(timezone="UTC")
    # Rollups, retention and closing observed jobs run on one replica at a time (whichever
    # takes the turn); every replica creates partitions, which also fills its own cache.
    jobs: list[tuple[str, Callable[[], object], float]] = [
        (
            "rollup",
            one_replica_at_a_time(ctx, "rollup", lambda: rollup_once(ctx)),
            s.rollup_interval_seconds,
        ),
        (
            "retention",
            one_replica_at_a_time(ctx, "retention", lambda: retention_once(ctx)),
            s.retention_interval_seconds,
        ),
        ("partitions", lambda: partitions_once(ctx), 3600.0),
        (
            "observed_jobs",
            one_replica_at_a_time(ctx, "observed_jobs", lambda: observed_jobs_once(ctx)),
            s.observed_jobs_interval_seconds,
        ),
        (
            "cost_days",
            one_replica_at_a_time(ctx, "cost_days", lambda: cost_days_once(ctx)),
            s.cost_days_interval_seconds,
        ),
    ]
    # Alerting: only the leader (PostgreSQL advisory lock) evaluates and sends, so two replicas
    # never notify twice.
    from service.usecases.evaluation import Alerting
    from service.usecases.ladder import Ladder

    alerting = Alerting(ctx)
    ctx.shutdown_hooks.append(alerting.close)
    # The warn-then-reclaim ladder acts on the leader's alerts, after it, at the same pace.
    ladder = Ladder(alerting)
    ctx.shutdown_hooks.append(ladder.close)
    from service.usecases.periodic_reports import ReportScheduler

    reports = ReportScheduler(ctx, alerting.leader)
    jobs += [
        ("evaluate", alerting.evaluate_tick, s.eval_interval_seconds),
        ("ladder", ladder.tick, s.eval_interval_seconds),
        ("deliver", alerting.deliver_tick, s.outbox_interval_seconds),
        ("reports", reports.tick, s.report_interval_seconds),
    ]

    def count_skip(event: JobSubmissionEvent) -> None:
        ctx.telemetry.job_runs.labels(event.job_id, "skipped").inc()

    sched.add_listener(count_skip, EVENT_JOB_MAX_INSTANCES)
    for name, fn, every in jobs:
        ctx.telemetry.task(name)
        sched.add_job(
            run_job,
            "interval",
            args=(ctx, name, fn),
            seconds=every,
            id=name,
            max_instances=1,
            coalesce=True,
            next_run_time=None,
        )
    return sched


def start_scheduler(ctx: ServiceContext) -> BackgroundScheduler:
    """Build the scheduler, start it and run every job once now; the caller shuts it down."""
    sched = build_scheduler(ctx)
    sched.start()
    now = datetime.now(UTC)
    for job in sched.get_jobs():
        job.modify(next_run_time=now)
    return sched
