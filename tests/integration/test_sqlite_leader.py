"""One actor on a SQLite file (issue 45, part 8): a second process on the same database file is
never the evaluator's leader (so never evaluates, sends or runs the ladder), says why once, and
takes over when the first process dies."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.api.app import create_app
from service.db.engine import make_engine
from service.db.leader import LeaderLock
from service.db.migrate import upgrade
from service.scheduler import build_scheduler, run_job
from service.settings import Settings
from tests.process_support import start_central, stop, wait_until
from tests.support import free_port


def leads(lock: LeaderLock) -> bool:
    """Whether ``lock`` held the lead at its last check (read through a call, so each read
    is a fresh one to the type checker)."""
    return lock.held


def test_two_engines_on_one_file_have_one_leader_until_it_lets_go(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'warden.db'}"
    first, second = make_engine(url), make_engine(url)
    a, b = LeaderLock(first), LeaderLock(second)
    try:
        assert a.check() and leads(a)
        with caplog.at_level(logging.INFO, logger="service.db.leader"):
            assert not b.check() and not b.check() and not leads(b)
            told = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
            assert len(told) == 1, told  # said once, not every round
            assert "warden.db.leader.lock" in told[0] and "does not" in told[0]
            assert a.check()  # the leader stays the leader
            a.release()
            assert b.check() and leads(b) and b.acquisitions == 1
            assert any("took over" in r.getMessage() for r in caplog.records)
        assert not a.check()  # now the first one waits
    finally:
        a.release()
        b.release()
        first.dispose()
        second.dispose()


def test_an_in_memory_database_is_always_its_own_leader() -> None:
    engine = make_engine("sqlite://")
    try:
        assert LeaderLock(engine).check() and LeaderLock(engine).check()
    finally:
        engine.dispose()


def _count(ctx: Any, task: str, outcome: str) -> float:
    return float(ctx.telemetry.job_runs.labels(task, outcome)._value.get())


def test_a_second_app_on_the_file_runs_no_leader_rounds(tmp_path: Path) -> None:
    """The scheduler's evaluate, ladder, deliver and reports rounds of a process that is not
    the leader do nothing and count as ``elsewhere``."""
    url = f"sqlite:///{tmp_path / 'warden.db'}"
    engine, holder_engine = make_engine(url), make_engine(url)
    upgrade(engine)
    holder = LeaderLock(holder_engine)
    assert holder.check()
    try:
        ctx = create_app(Settings(database_url=url, run_scheduler=False), engine=engine).state.ctx
        ticks = {job.id: job.args for job in build_scheduler(ctx).get_jobs()}
        for task in ("evaluate", "ladder", "deliver", "reports"):
            before = (_count(ctx, task, "elsewhere"), _count(ctx, task, "ok"))
            assert run_job(*ticks[task]) is None
            after = (_count(ctx, task, "elsewhere"), _count(ctx, task, "ok"))
            assert after == (before[0] + 1, before[1]), task
        for hook in ctx.shutdown_hooks:
            hook()
    finally:
        holder.release()
        engine.dispose()
        holder_engine.dispose()


def _leader(port: int) -> float | None:
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith("gpuwarden_evaluator_leader "):
            return float(line.split()[1])
    return None


def test_two_serve_processes_on_one_file_have_one_leader_and_the_second_takes_over(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'warden.db'}"
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    env = {"GPUWARDEN_EVAL_INTERVAL_SECONDS": "0.5"}
    port_a, port_b = free_port(), free_port()
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    a = start_central(url, port_a, log_a, env)
    try:
        wait_until("the first serve to lead", lambda: _leader(port_a) == 1)
        b = start_central(url, port_b, log_b, env)
        try:
            wait_until("the second serve to report", lambda: _leader(port_b) == 0)
            wait_until("the second serve to say why", lambda: "leader.lock" in log_b.read_text())
            assert _leader(port_a) == 1
            stop(a, signal.SIGKILL)  # dies without releasing: the OS frees the lock
            wait_until("the second serve to take over", lambda: _leader(port_b) == 1)
            assert log_b.read_text().count("does not evaluate alerts") == 1
        finally:
            stop(b)
    finally:
        stop(a, signal.SIGKILL)
