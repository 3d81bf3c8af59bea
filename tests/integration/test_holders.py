"""One answer to "which job holds this GPU now": the same jobs, put through the REST API (the
console's fleet), /metrics and an alert's labels, name the same job on every surface."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from service.db.schema import alerts
from service.usecases.evaluation import evaluate_once
from tests.alerting_support import auth, ingest, low_sm_policy
from tests.support import FakeClock, iso

GPU = "GPU-a0"


@dataclass(frozen=True)
class Job:
    """A job as an agent (or, with ``by_admin``, an admin) registers it, times relative to the
    central clock in seconds."""

    id: str
    start_s: float
    end_s: float | None = None
    by_admin: bool = False


@dataclass(frozen=True)
class Case:
    name: str
    jobs: tuple[Job, ...]
    holder: str | None


CASES = [
    Case("running", (Job("j1", -120),), "j1"),
    Case("ended a minute ago", (Job("j1", -300, end_s=-60),), None),
    # The node's clock runs 60 s ahead of central's: the job runs now, by any user's account.
    Case("node clock 60 s ahead", (Job("j2", 60),), "j2"),
    Case("ended then a skewed successor", (Job("j1", -300, end_s=-90), Job("j2", 30)), "j2"),
    # Further ahead than any clock skew the service accepts: a job that has not started yet.
    Case("registered an hour ahead", (Job("j3", 3600, by_admin=True),), None),
]


def _register(http: httpx.Client, tokens: dict[str, str], clock: FakeClock, job: Job) -> None:
    headers = auth(tokens["admin" if job.by_admin else "agent"])
    start = clock() + timedelta(seconds=job.start_s)
    body = {"id": job.id, "user": "alice", "gpus": [GPU], "started_at": iso(start)}
    r = http.post("/api/v1/jobs", json=body, headers=headers)
    assert r.status_code == 201, r.text
    if job.end_s is not None:
        end = {"ended_at": iso(clock() + timedelta(seconds=job.end_s))}
        r = http.patch(f"/api/v1/jobs/{job.id}", json=end, headers=headers)
        assert r.status_code == 200, r.text


def _console(http: httpx.Client, tokens: dict[str, str], _: Any) -> str | None:
    r = http.get("/api/v1/gpus", headers=auth(tokens["reader"]))
    assert r.status_code == 200, r.text
    (gpu,) = (g for g in r.json() if g["uuid"] == GPU)
    job: str | None = gpu["job"]
    return job


def _metrics(http: httpx.Client, tokens: dict[str, str], _: Any) -> str | None:
    text = http.get("/metrics").text
    (sample,) = (
        s
        for fam in text_string_to_metric_families(text)
        if fam.name == "gpuwarden_gpu_job_info"
        for s in fam.samples
        if s.labels["gpu_uuid"] == GPU
    )
    return sample.labels["job_id"] or None


def _alert_labels(http: httpx.Client, tokens: dict[str, str], app: Any) -> str | None:
    policy = low_sm_policy([], name="low-sm-gpu", scope="gpu")
    r = http.post("/api/v1/policies", json=policy, headers=auth(tokens["admin"]))
    assert r.status_code == 201, r.text
    evaluate_once(app.state.ctx)
    with app.state.ctx.engine.connect() as conn:
        (labels,) = conn.execute(select(alerts.c.labels).where(alerts.c.policy == "low-sm-gpu"))
    assert labels[0]["gpu_uuid"] == GPU
    job: str | None = labels[0].get("job_id") or None
    return job


Surface = Callable[[httpx.Client, dict[str, str], Any], str | None]
SURFACES: dict[str, Surface] = {
    "console": _console,
    "metrics": _metrics,
    "alert labels": _alert_labels,
}


@pytest.mark.parametrize("surface", list(SURFACES))
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_surface_names_the_same_holder(
    app: Any,
    http: httpx.Client,
    tokens: dict[str, str],
    clock: FakeClock,
    case: Case,
    surface: str,
) -> None:
    ingest(
        http,
        tokens["agent"],
        start=clock() - timedelta(minutes=10),
        count=60,
        metrics={"sm_active": 0.1},
    )
    for job in case.jobs:
        _register(http, tokens, clock, job)
    assert SURFACES[surface](http, tokens, app) == case.holder
