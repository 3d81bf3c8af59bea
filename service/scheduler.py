"""Background jobs (rollups, retention, partitions); a failing run is logged and counted."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobSubmissionEvent
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers import SchedulerNotRunningError
from apscheduler.schedulers.background import BackgroundScheduler

from service.context import ServiceContext
from service.db import foreground
from service.db.leader import LeaderLock, job_turn
from service.db.outages import OutageLog, is_outage
from service.usecases.fleet import WastedTodayCache
from service.usecases.upkeep import (
    cost_days_once,
    fleet_dollars_once,
    observed_jobs_once,
    partitions_once,
    retention_once,
    rollup_once,
    today_sums_once,
)

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


# What a job returns when another replica holds its turn (counted as elsewhere, not timed).
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


def shard_by_shard(
    ctx: ServiceContext, name: str, count: int, fn: Callable[[tuple[int, int]], int]
) -> Callable[[], object]:
    """``fn`` run for each shard (index, count) whose turn (``job_turn`` of ``name:i/count``)
    no other replica holds, starting at a random shard so replicas that tick together start
    apart; returns the sum of ``fn``'s counts, or ``ELSEWHERE`` when other replicas held every
    shard. One shard is ``name`` alone; every replica must split ``name`` alike."""
    if count == 1:
        return one_replica_at_a_time(ctx, name, lambda: fn((0, 1)))

    def run() -> object:
        first = random.randrange(count)
        results: list[int] = []
        for i in ((first + k) % count for k in range(count)):
            with job_turn(ctx.engine, f"{name}:{i}/{count}") as mine:
                if mine:
                    results.append(fn((i, count)))
        return sum(results) if results else ELSEWHERE

    return run


def on_the_leader(leader: LeaderLock, tick: Callable[[], object]) -> Callable[[], object]:
    """``tick`` (which acts only while this replica is the evaluator's leader), returning
    ``ELSEWHERE`` when this replica was not the leader."""

    def run() -> object:
        result = tick()
        return result if leader.held else ELSEWHERE

    return run


# Jobs that write only rows no other writer touches (the rollups, the tenants' shares, keyless
# dirty marks): on PostgreSQL they may give way to reads while holding those writes.
OWN_ROWS_JOBS = frozenset({"rollup"})


def run_job(ctx: ServiceContext, name: str, fn: Callable[[], object]) -> object:
    """Run ``fn`` as background job ``name``: time it, count the outcome, never raise.

    A run that found another replica holding its turn counts as ``elsewhere`` and is not timed,
    so the duration histogram holds only runs that did the work."""
    started = time.perf_counter()
    try:
        # It gives way to API reads of this process (db/foreground.py).
        with foreground.background_round(own_rows=name in OWN_ROWS_JOBS):
            result = fn()
    except Exception as exc:
        if is_outage(exc):
            _OUTAGES.failed(exc, f"background job {name}")  # one line, not one per tick
        else:
            log.exception("background job %s failed", name)
        ctx.telemetry.job_runs.labels(name, "error").inc()
        ctx.telemetry.db_errors.labels(name).inc()
        ctx.telemetry.job_seconds.labels(name).observe(time.perf_counter() - started)
        return None
    if result is ELSEWHERE:
        ctx.telemetry.job_runs.labels(name, "elsewhere").inc()
        return None
    ctx.telemetry.job_seconds.labels(name).observe(time.perf_counter() - started)
    ctx.telemetry.job_runs.labels(name, "ok").inc()
    return result


def then_check_today(
    sched: BackgroundScheduler, rollup: Callable[[], object]
) -> Callable[[], object]:
    """``rollup``, after which a run that rolled buckets up brings the today-sums check forward
    to now: the minutes it rolled that today's sums hold are marked stale, and until the sums
    are written again the pages read those GPUs' today from the minute rollups (up to a
    rollup interval more, as the two jobs tick apart; a fleet's first rollups mark them all)."""

    def bring_forward() -> None:
        try:
            job = sched.get_job("today_sums")
            if job is not None and sched.running:
                job.modify(next_run_time=datetime.now(UTC))
        except (JobLookupError, SchedulerNotRunningError):
            pass  # stopped meanwhile: nothing to bring forward

    def run() -> object:
        result = rollup()
        if isinstance(result, int) and result > 0 and sched.running:
            # From a thread of its own: a shutdown holds the scheduler's lock while it waits
            # for this job's thread, so taking that lock here would deadlock the shutdown.
            threading.Thread(target=bring_forward, name="today-sums-now", daemon=True).start()
        return result

    return run


def build_scheduler(
    ctx: ServiceContext, *, fleet_cache: WastedTodayCache | None = None
) -> BackgroundScheduler:
    """A scheduler with the storage jobs (and, given the API's ``fleet_cache``, one keeping the
    fleet's dollars in it current); the caller starts and stops it."""
    s = ctx.settings
    sched = BackgroundScheduler(timezone="UTC")
    # Rollups, retention and closing observed jobs run on one replica at a time (whichever
    # takes the turn); every replica creates partitions, which also fills its own cache.
    jobs: list[tuple[str, Callable[[], object], float]] = [
        (
            "rollup",
            then_check_today(
                sched,
                shard_by_shard(
                    ctx, "rollup", s.rollup_shards, lambda shard: rollup_once(ctx, shard=shard)
                ),
            ),
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
        # Today's sums as soon as they are missing or stale, not a cost-days interval later:
        # until they exist the jobs and costs pages read today from the minute rollups. It
        # writes what the cost-days job writes, so it takes that job's turn.
        (
            "today_sums",
            one_replica_at_a_time(ctx, "cost_days", lambda: today_sums_once(ctx)),
            s.rollup_interval_seconds,
        ),
    ]
    from service.usecases.savings import savings_once

    # Each cause's promises relearn their calibration from the savings realised (issue 46).
    jobs.append(
        (
            "savings",
            one_replica_at_a_time(ctx, "savings", lambda: savings_once(ctx)),
            s.savings_calibration_interval_seconds,
        )
    )
    # Sham and hung time (issue 47): judged on one replica, at the alerts' pace, so a policy on
    # cause:sham or cause:hung reads it at its next evaluation.
    from service.usecases.useful_work import useful_work_once

    jobs.append(
        (
            "useful_work",
            one_replica_at_a_time(ctx, "useful_work", lambda: useful_work_once(ctx)),
            s.eval_interval_seconds,
        )
    )
    if fleet_cache is not None:
        # Every replica keeps its own copy of the fleet's dollars, read once as today's sums move.
        jobs.append(
            (
                "fleet_dollars",
                lambda: fleet_dollars_once(ctx, fleet_cache),
                s.rollup_interval_seconds,
            )
        )
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
    leader = alerting.leader
    jobs += [
        ("evaluate", on_the_leader(leader, alerting.evaluate_tick), s.eval_interval_seconds),
        ("ladder", on_the_leader(leader, ladder.tick), s.eval_interval_seconds),
        ("deliver", on_the_leader(leader, alerting.deliver_tick), s.outbox_interval_seconds),
        ("reports", on_the_leader(leader, reports.tick), s.report_interval_seconds),
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


def start_scheduler(
    ctx: ServiceContext, *, fleet_cache: WastedTodayCache | None = None
) -> BackgroundScheduler:
    """Build the scheduler, start it and run every job once now; the caller shuts it down."""
    sched = build_scheduler(ctx, fleet_cache=fleet_cache)
    sched.start()
    now = datetime.now(UTC)
    for job in sched.get_jobs():
        job.modify(next_run_time=now)
    return sched
