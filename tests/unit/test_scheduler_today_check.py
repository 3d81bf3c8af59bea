"""A rollup run that rolled buckets up brings the today-sums check forward to now, and a
shutdown that waits for such a run still ends."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.background import BackgroundScheduler

from service.scheduler import ELSEWHERE, then_check_today


def _sched() -> tuple[BackgroundScheduler, datetime]:
    sched = BackgroundScheduler(timezone="UTC")
    later = datetime.now(UTC) + timedelta(hours=1)
    sched.add_job(lambda: None, "interval", seconds=15, id="today_sums", next_run_time=later)
    sched.start(paused=True)
    return sched, later


def _next_run(sched: BackgroundScheduler) -> datetime:
    job = sched.get_job("today_sums")
    assert job is not None
    return job.next_run_time  # type: ignore[no-any-return]


def test_a_rollup_that_rolled_buckets_brings_the_today_check_forward() -> None:
    sched, later = _sched()
    try:
        assert then_check_today(sched, lambda: 12)() == 12
        deadline = time.monotonic() + 10
        while _next_run(sched) == later and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _next_run(sched) < later - timedelta(minutes=59)
    finally:
        sched.shutdown(wait=False)


def test_a_rollup_with_nothing_rolled_or_run_elsewhere_leaves_it() -> None:
    sched, later = _sched()
    try:
        assert then_check_today(sched, lambda: 0)() == 0
        assert then_check_today(sched, lambda: ELSEWHERE)() is ELSEWHERE
        time.sleep(0.2)
        assert _next_run(sched) == later
    finally:
        sched.shutdown(wait=False)


def test_a_shutdown_waiting_for_a_rollup_that_rolled_ends() -> None:
    """The scheduler's shutdown holds its lock while it waits for running jobs: a rollup that
    then brought the check forward in its own thread would never end, nor the shutdown."""
    sched, _ = _sched()
    sched.resume()
    shutting_down = threading.Event()

    def rollup() -> int:
        shutting_down.wait(10)
        time.sleep(0.2)  # the shutdown is now waiting for this job, holding its lock
        return 12

    sched.add_job(then_check_today(sched, rollup), id="rollup")
    time.sleep(0.2)  # the rollup job is running
    done = threading.Event()

    def stop() -> None:
        shutting_down.set()
        sched.shutdown(wait=True)
        done.set()

    threading.Thread(target=stop, daemon=True).start()
    assert done.wait(10), "the shutdown never ended"
