"""Observed jobs: process observations at ingest become jobs and GPU intervals; unseen ones close."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, insert, select, update

from service.api.app import create_app
from service.db import observed_jobs_repo
from service.db.schema import job_gpus, jobs
from service.settings import Settings
from service.usecases.upkeep import observed_jobs_once
from tests.support import FakeClock, iso, make_batch


def post(http: httpx.Client, token: str, batch: dict[str, Any]) -> None:
    r = http.post("/api/v1/ingest", json=batch, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text


def batch_with_jobs(clock: FakeClock, seconds: int, jobs_by_gpu: dict[str, str]) -> dict[str, Any]:
    start = clock() + timedelta(seconds=seconds)
    b = make_batch(gpu_uuids=tuple(sorted(jobs_by_gpu)), start=start, count=1)
    b["processes"] = [
        {
            "gpu_uuid": u,
            "ts": iso(start),
            "pid": 100 + i,
            "fb_used_bytes": 2**30,
            "job_id": j,
            "user": "bob",
        }
        for i, (u, j) in enumerate(sorted(jobs_by_gpu.items()))
    ]
    return b


def intervals(engine: Engine) -> list[tuple[str, str, Any, Any, str]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                select(
                    jobs.c.id,
                    job_gpus.c.gpu_id,
                    job_gpus.c.started_at,
                    job_gpus.c.ended_at,
                    job_gpus.c.source,
                )
                .join(jobs, jobs.c.id == job_gpus.c.job_id)
                .order_by(jobs.c.id, job_gpus.c.started_at)
            ).all()
        ]


def test_observed_job_opens_on_first_sight_and_closes_after_grace(
    http: httpx.Client, engine: Engine, clock: FakeClock, tokens, settings: Settings
):
    ctx = create_app(settings, engine=engine, clock=clock).state.ctx
    for k in range(6):
        post(
            http,
            tokens["agent"],
            batch_with_jobs(clock, 10 * k, {"GPU-a0": "slurm:1", "GPU-a1": "slurm:1"}),
        )
    with engine.connect() as conn:
        job = conn.execute(select(jobs).where(jobs.c.id == "slurm:1")).one()
    assert job.source == "observed" and job.user == "bob" and job.ended_at is None
    assert job.started_at == clock()
    rows = intervals(engine)
    assert len(rows) == 2 and all(r[3] is None and r[4] == "observed" for r in rows)

    clock.advance(50 + settings.observed_job_grace_seconds - 1)
    assert observed_jobs_once(ctx) == 0  # still inside the grace period
    clock.advance(2)
    assert observed_jobs_once(ctx) == 2
    rows = intervals(engine)
    last_seen = clock() - timedelta(seconds=settings.observed_job_grace_seconds + 1)
    assert [r[3] for r in rows] == [last_seen, last_seen]
    with engine.connect() as conn:
        assert (
            conn.execute(select(jobs.c.ended_at).where(jobs.c.id == "slurm:1")).scalar_one()
            == last_seen
        )


def test_late_observations_reopen_the_interval_unless_another_job_took_the_gpu(
    http: httpx.Client, engine: Engine, clock: FakeClock, tokens, settings: Settings
):
    ctx = create_app(settings, engine=engine, clock=clock).state.ctx
    t0 = clock()
    post(http, tokens["agent"], batch_with_jobs(clock, 0, {"GPU-a0": "slurm:1"}))
    clock.advance(settings.observed_job_grace_seconds + 60)
    assert observed_jobs_once(ctx) == 1
    # The agent's spooled batch from during the outage arrives: same job, nobody else since.
    post(http, tokens["agent"], batch_with_jobs(clock, -120, {"GPU-a0": "slurm:1"}))
    rows = intervals(engine)
    assert [(r[0], r[2], r[3]) for r in rows] == [("slurm:1", t0, None)]
    # Another job takes the GPU; when job 1 shows up again it gets a new interval.
    clock.advance(settings.observed_job_grace_seconds + 60)
    observed_jobs_once(ctx)
    post(http, tokens["agent"], batch_with_jobs(clock, 0, {"GPU-a0": "slurm:2"}))
    clock.advance(30)
    post(http, tokens["agent"], batch_with_jobs(clock, 0, {"GPU-a0": "slurm:1"}))
    rows = intervals(engine)
    assert [(r[0], r[3] is None) for r in rows] == [
        ("slurm:1", False),
        ("slurm:1", True),
        ("slurm:2", True),
    ]


def test_jobs_registered_through_the_api_are_never_overwritten(
    http: httpx.Client, engine: Engine, clock: FakeClock, tokens, settings: Settings
):
    with engine.begin() as conn:
        conn.execute(
            insert(jobs).values(
                id="slurm:7",
                user="alice",
                team="vision",
                project="p1",
                labels={},
                source="api",
                started_at=clock() - timedelta(hours=1),
                ended_at=None,
                created_at=clock(),
                updated_at=clock(),
            )
        )
    post(http, tokens["agent"], batch_with_jobs(clock, 0, {"GPU-a0": "slurm:7"}))
    with engine.connect() as conn:
        job = conn.execute(select(jobs).where(jobs.c.id == "slurm:7")).one()
    assert (job.user, job.team, job.project, job.source) == ("alice", "vision", "p1", "api")
    assert job.started_at == clock() - timedelta(hours=1)
    rows = intervals(engine)
    assert [(r[0], r[4]) for r in rows] == [("slurm:7", "observed")]  # the GPU it was seen on


def test_processes_without_a_job_make_no_jobs(
    http: httpx.Client, engine: Engine, clock: FakeClock, tokens
):
    b = batch_with_jobs(clock, 0, {"GPU-a0": "x"})
    b["processes"][0]["job_id"] = None
    post(http, tokens["agent"], b)
    assert intervals(engine) == []


def test_a_steady_node_costs_no_job_statements_and_a_change_elsewhere_is_seen_within_a_minute(
    http: httpx.Client,
    engine: Engine,
    clock: FakeClock,
    tokens: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[int] = []
    observe = observed_jobs_repo.observe

    def spy(conn: Any, **kwargs: Any) -> dict[str, int]:
        asked.append(len(kwargs["seen"]))
        return observe(conn, **kwargs)

    monkeypatch.setattr(observed_jobs_repo, "observe", spy)
    same = {"GPU-a0": "slurm:1", "GPU-a1": "slurm:1"}
    for _ in range(5):
        post(http, tokens["agent"], batch_with_jobs(clock, 0, same))
        clock.advance(10)
    # The first batch made sure of both GPUs' job; the next four had nothing new to ask.
    assert asked == [2, 0, 0, 0, 0]
    # A new job on one GPU is asked about at once, the other GPU's is not.
    post(http, tokens["agent"], batch_with_jobs(clock, 0, {**same, "GPU-a1": "slurm:2"}))
    assert asked[-1] == 1
    # Closed behind this process's back (another replica, a script): reopened once the
    # sighting is a minute old, with no gap in the job's time.
    with engine.begin() as conn:
        conn.execute(
            update(job_gpus).where(job_gpus.c.job_id == "slurm:1").values(ended_at=clock())
        )
    clock.advance(61)
    post(http, tokens["agent"], batch_with_jobs(clock, 0, same))
    assert asked[-1] == 2
    rows = [r for r in intervals(engine) if r[0] == "slurm:1"]
    # Open again on both GPUs: GPU-a0's interval reopened (nobody took it since), GPU-a1 a new
    # one after slurm:2's time on it.
    assert len({r[1] for r in rows if r[3] is None}) == 2 and len(rows) == 3
