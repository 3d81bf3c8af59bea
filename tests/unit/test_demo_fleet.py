"""The demo's jobs: every simulated job registered with its user's team and a project, plus an
allocation on each empty GPU, so a report by team has no ``__unknown__`` row."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from service.collectors.simulated import SCENARIOS, SimulatedBackend
from service.local.demo import DEMO_TEAMS, demo_jobs, plan_history


def test_every_job_has_its_users_team_and_a_project() -> None:
    start = datetime(2026, 12, 3, tzinfo=UTC)
    backends = [
        SimulatedBackend(hostname=f"n{i}", gpus=5, seed=i, start=start, job_base=1000 + 100 * i,
                         scenarios=[SCENARIOS[(i * 5 + k) % len(SCENARIOS)] for k in range(5)])
        for i in range(3)
    ]  # fmt: skip
    jobs = demo_jobs(backends)
    with_process = {b.job_of(d.index) for b in backends for d in b.devices()} - {None}
    assert {j.job_id for j in jobs if j.gpu_uuid is None} == with_process
    for j in jobs:
        team, projects = DEMO_TEAMS[j.user]
        assert j.team == team and j.project in projects
    assert {j.team for j in jobs} == {team for team, _ in DEMO_TEAMS.values()}
    empty = [d.uuid for b in backends for d in b.devices() if b.scenarios[d.index] == "idle"]
    assert sorted(j.gpu_uuid for j in jobs if j.gpu_uuid) == sorted(empty) and empty


def test_a_restart_resumes_the_stored_history_and_backfills_at_most_an_hour_of_the_gap() -> None:
    now = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    hour, step = timedelta(hours=1), timedelta(seconds=5)
    fresh = plan_history(None, now=now, history=hour, step=step)
    assert (fresh.resumed, fresh.fleet_start, fresh.backfill_from) == (
        False,
        now - hour,
        now - hour,
    )
    first = now - timedelta(hours=5)
    soon = plan_history((first, now - timedelta(minutes=3)), now=now, history=hour, step=step)
    assert soon.resumed and soon.fleet_start == first  # the scenarios go on where they were
    assert soon.backfill_from == now - timedelta(minutes=3) + step  # only after the last sample
    late = plan_history((first, now - timedelta(hours=3)), now=now, history=hour, step=step)
    assert late.backfill_from == now - hour  # the rest of a long stop reads no data
    assert "a new history" in fresh.says("demo.db") and "resuming" in late.says("demo.db")
