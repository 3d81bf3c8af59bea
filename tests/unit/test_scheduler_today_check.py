"""A rollup run that rolled buckets up brings the today-sums check forward to now."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.background import BackgroundScheduler

from service.scheduler import ELSEWHERE, then_check_today


def _sched() -> tuple[BackgroundScheduler, datetime]:
    sched = BackgroundScheduler(timezone="UTC")
    later = datetime.now(UTC) + timedelta(hours=1)
    sched.add_job(lambda: None, "interval", seconds=15, id="today_sums", next_run_time=later)
    sched.start(paused=True)
    return sched, later


def test_a_rollup_that_rolled_buckets_brings_the_today_check_forward() -> None:
    sched, later = _sched()
    try:
        assert then_check_today(sched, lambda: 12)() == 12
        job = sched.get_job("today_sums")
        assert job is not None and job.next_run_time < later - timedelta(minutes=59)
    finally:
        sched.shutdown(wait=False)


def test_a_rollup_with_nothing_rolled_or_run_elsewhere_leaves_it() -> None:
    sched, later = _sched()
    try:
        assert then_check_today(sched, lambda: 0)() == 0
        assert then_check_today(sched, lambda: ELSEWHERE)() is ELSEWHERE
        job = sched.get_job("today_sums")
        assert job is not None and job.next_run_time == later
    finally:
        sched.shutdown(wait=False)
