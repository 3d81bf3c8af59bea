"""A Slurm id reused by a new job (MaxJobId wrapped, or a requeued job running again) is a new
job: the ended record of that id moves to ``slurm:<id>@<its start>`` with its intervals, costs
and ladder history, and the new run registers under the id, whoever's it is (issue 45, case 7).
Before, another user's new job was refused (409) and the same user's merged into the ended one."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from sqlalchemy import Engine, func, select

from service.db import actions_repo
from service.db.rows import NewAction
from service.db.schema import job_gpus, jobs
from service.usecases.upkeep import rollup_once
from tests.alerting_support import add_price, auth, ingest
from tests.conftest import make_token
from tests.support import FakeClock, iso

JOB = "slurm:101"


def path(job_id: str) -> str:
    return "/api/v1/jobs/" + quote(job_id, safe="")


def register(http: httpx.Client, token: str, user: str, gpu: str, at: datetime) -> httpx.Response:
    body = {"id": JOB, "user": user, "team": "ml", "gpus": [gpu], "started_at": iso(at)}
    return http.post("/api/v1/jobs", json=body, headers=auth(token))


@pytest.fixture
def ended_run(
    app: Any, http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock
) -> tuple[datetime, str]:
    """alice's run of slurm:101 on node-a's GPU, 10 minutes of samples, a ladder warning, then
    its end; the clock a minute past it. Returns (its start, the id it moves to)."""
    start = clock() - timedelta(minutes=1)
    add_price(engine, "*", 2.0, start)
    ingest(http, tokens["agent"], start=start, count=1, metrics={"sm_active": 0.0})
    started = start + timedelta(seconds=10)
    assert register(http, tokens["agent"], "alice", "GPU-a0", started).status_code == 201
    ended = started + timedelta(minutes=10)
    clock.set(ended + timedelta(minutes=1))
    ingest(http, tokens["agent"], start=started, count=60, metrics={"sm_active": 0.0})
    with engine.begin() as conn:
        actions_repo.record_action(
            conn,
            NewAction(
                at=ended - timedelta(minutes=1), policy="idle-held-job", job_id=JOB,
                action="notify_owner", outcome="warned", dry_run=False, user="alice", team="ml",
            ),
        )  # fmt: skip
    r = http.patch(path(JOB), json={"ended_at": iso(ended)}, headers=auth(tokens["agent"]))
    assert r.status_code == 200 and r.json()["ended_at"] is not None, r.text
    rollup_once(app.state.ctx)
    return started, f"{JOB}@{started:%Y%m%dT%H%M%SZ}"


def test_another_user_s_job_under_a_wrapped_id_registers_and_the_old_one_moves_aside(
    app: Any, http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock,
    ended_run: tuple[datetime, str],
) -> None:  # fmt: skip
    _, moved = ended_run
    reader = auth(tokens["reader"])
    before = http.get(path(JOB), headers=reader).json()["summary"]
    node_b = make_token(engine, "agent", "node-b")
    ingest(http, node_b, start=clock(), count=1, metrics={"sm_active": 0.5}, gpu_uuids=("GPU-b0",),
           hostname="node-b")  # fmt: skip
    new_start = clock() + timedelta(seconds=5)
    r = register(http, node_b, "bob", "GPU-b0", new_start)
    assert r.status_code == 201, r.text
    new = http.get(path(JOB), headers=reader).json()
    assert (new["user"], new["ended_at"], new["started_at"]) == ("bob", None, iso(new_start))
    assert [g["gpu_uuid"] for g in new["gpus"]] == ["GPU-b0"]
    old = http.get(path(moved), headers=reader)
    assert old.status_code == 200, old.text
    old_job = old.json()
    assert old_job["user"] == "alice" and old_job["ended_at"] is not None
    assert [g["gpu_uuid"] for g in old_job["gpus"]] == ["GPU-a0"]
    # Its money and ladder history read the same under the moved id.
    assert old_job["summary"]["held_seconds"] == pytest.approx(600, abs=1)
    assert old_job["summary"]["cost_usd"] == pytest.approx(before["cost_usd"]) != 0
    actions = http.get("/api/v1/actions", params={"job": moved}, headers=reader).json()
    assert [(a["job_id"], a["outcome"]) for a in actions] == [(moved, "warned")]
    assert http.get("/api/v1/actions", params={"job": JOB}, headers=reader).json() == []


def test_the_same_user_s_job_under_a_wrapped_id_is_a_new_open_job(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock,
    ended_run: tuple[datetime, str],
) -> None:  # fmt: skip
    started, moved = ended_run
    new_start = clock() + timedelta(seconds=5)
    ingest(http, tokens["agent"], start=clock(), count=1, metrics={"sm_active": 0.5})
    r = register(http, tokens["agent"], "alice", "GPU-a0", new_start)
    assert r.status_code == 201, r.text  # created, not merged into the ended run
    assert (r.json()["ended_at"], r.json()["started_at"]) == (None, iso(new_start))
    assert [(g["started_at"], g["ended_at"]) for g in r.json()["gpus"]] == [(iso(new_start), None)]
    old = http.get(path(moved), headers=auth(tokens["reader"])).json()
    assert old["started_at"] == iso(started) and old["ended_at"] is not None
    # Another node of the new run (or its prolog retried) joins it.
    again = register(http, tokens["agent"], "alice", "GPU-a0", new_start)
    assert again.status_code == 200, again.text
    with engine.connect() as conn:
        ids = conn.execute(select(jobs.c.id).order_by(jobs.c.id)).scalars().all()
        intervals = conn.execute(
            select(job_gpus.c.job_id, func.count()).group_by(job_gpus.c.job_id)
        ).all()
    assert ids == [JOB, moved]
    assert sorted(intervals) == [(JOB, 1), (moved, 1)]


def test_the_same_run_registered_again_is_merged_not_moved(
    http: httpx.Client, tokens: dict[str, str], ended_run: tuple[datetime, str]
) -> None:
    """A retried prolog of the run that ended starts when that run started: no new job."""
    started, moved = ended_run
    r = register(http, tokens["agent"], "alice", "GPU-a0", started)
    assert r.status_code == 200, r.text
    assert r.json()["ended_at"] is not None
    assert http.get(path(moved), headers=auth(tokens["reader"])).status_code == 404


def test_a_refused_registration_moves_nothing(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock,
    ended_run: tuple[datetime, str],
) -> None:  # fmt: skip
    """node-b's token naming node-a's GPU is refused (403); the ended record stays put."""
    _, moved = ended_run
    node_b = make_token(engine, "agent", "node-b")
    r = register(http, node_b, "mallory", "GPU-a0", clock())
    assert r.status_code == 403, r.text
    reader = auth(tokens["reader"])
    assert http.get(path(JOB), headers=reader).json()["user"] == "alice"
    assert http.get(path(moved), headers=reader).status_code == 404
