"""The shipped allocated-idle-gpu policy fires on a job whose GPU runs nothing and holds
nothing, and not on one whose GPU holds a process's memory."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import yaml

from service.usecases.evaluation import evaluate_once
from service.usecases.upkeep import rollup_once
from tests.alerting_support import add_job, auth, ingest
from tests.support import FakeClock, make_batch

EXAMPLE = Path(__file__).parents[2] / "deploy" / "examples" / "gpuwarden.yaml"
# Two jobs sharing a GPU; their ids as squeue prints them (a process hint spelt otherwise is
# cleared at ingest).
BUSY_JOB, IDLE_JOB = "slurm:1001", "slurm:1002"


def _shipped(name: str) -> dict[str, Any]:
    docs: list[dict[str, Any]] = yaml.safe_load(EXAMPLE.read_text())["policies"]
    doc = next(p for p in docs if p["name"] == name)
    return doc | {"channels": ["log"]}


def _with_shipped_policy(app: Any, http: httpx.Client, tokens: dict[str, str]) -> tuple[Any, str]:
    """The shipped allocated-idle-gpu policy in place, sending to a channel nobody drains:
    (the service context, the agent token)."""
    ctx = app.state.ctx
    admin, agent = auth(tokens["admin"]), tokens["agent"]
    ctx.settings.webhook_allow_nets = "127.0.0.0/8"
    channel = {"name": "log", "type": "webhook", "url": "http://127.0.0.1:9/in"}
    assert http.post("/api/v1/channels", json=channel, headers=admin).status_code == 201
    policy = _shipped("allocated-idle-gpu")
    assert http.post("/api/v1/policies", json=policy, headers=admin).status_code == 201
    return ctx, agent


def test_allocated_idle_gpu_fires_on_an_empty_allocation(
    app, http: httpx.Client, tokens, engine, clock: FakeClock
) -> None:
    ctx, agent = _with_shipped_policy(app, http, tokens)
    start = clock() - timedelta(minutes=70)
    # GPU-a0: nothing running, only the driver's 0.5 GiB; GPU-a1: 20 GiB held, nothing running.
    ingest(
        http,
        agent,
        start=start,
        count=420,
        gpu_uuids=("GPU-a0",),
        metrics={"sm_active": 0.0, "gpu_util": 0.0, "fb_used_bytes": 2**29},
    )
    ingest(
        http,
        agent,
        start=start,
        count=420,
        gpu_uuids=("GPU-a1",),
        metrics={"sm_active": 0.0, "gpu_util": 0.0, "fb_used_bytes": 20 * 2**30},
    )
    add_job(engine, "slurm:empty", ("GPU-a0",), started_at=start)
    add_job(engine, "slurm:held", ("GPU-a1",), started_at=start)
    rollup_once(ctx)
    evaluate_once(ctx)
    clock.advance(31 * 60)
    ingest(
        http,
        agent,
        start=clock() - timedelta(minutes=31),
        count=186,
        gpu_uuids=("GPU-a0",),
        metrics={"sm_active": 0.0, "gpu_util": 0.0, "fb_used_bytes": 2**29},
    )
    ingest(
        http,
        agent,
        start=clock() - timedelta(minutes=31),
        count=186,
        gpu_uuids=("GPU-a1",),
        metrics={"sm_active": 0.0, "gpu_util": 0.0, "fb_used_bytes": 20 * 2**30},
    )
    rollup_once(ctx)
    evaluate_once(ctx)
    firing = http.get("/api/v1/alerts?state=firing", headers=auth(tokens["reader"])).json()
    keys = {(a["policy"], a["scope_key"]) for a in firing}
    assert ("allocated-idle-gpu", "job:slurm:empty") in keys
    assert ("allocated-idle-gpu", "job:slurm:held") not in keys


BUSY = {
    "sm_active": 0.9,
    "gr_engine_active": 0.95,
    "tensor_active": 0.8,
    "fb_used_bytes": 10 * 2**30,
}


def _shared(http: httpx.Client, token: str, start: datetime, count: int) -> None:
    """GPU-s0 busy with BUSY_JOB's process; IDLE_JOB holds it and runs nothing."""
    batch = make_batch(gpu_uuids=("GPU-s0",), start=start, count=count, metrics=BUSY)
    batch["processes"] = [
        {
            "gpu_uuid": "GPU-s0",
            "ts": s["ts"],
            "pid": 4242,
            "fb_used_bytes": 10 * 2**30,
            "sm_util": 0.6,
            "job_id": BUSY_JOB,
        }
        for s in batch["samples"]
    ]
    r = http.post("/api/v1/ingest", json=batch, headers=auth(token))
    assert r.status_code == 200, r.text


def test_allocated_idle_gpu_fires_on_a_job_idle_beside_a_busy_one(
    app, http: httpx.Client, tokens, engine, clock: FakeClock
) -> None:
    """On a GPU two jobs share, the GPU is busy with one job's kernels; the other job holds it
    and runs nothing: its own tenant rows say idle_empty, and the job-scope policy reads them."""
    ctx, agent = _with_shipped_policy(app, http, tokens)
    start = clock() - timedelta(minutes=70)
    ingest(http, agent, start=start, count=1, gpu_uuids=("GPU-s0",), metrics=BUSY)
    add_job(engine, BUSY_JOB, ("GPU-s0",), started_at=start)
    add_job(engine, IDLE_JOB, ("GPU-s0",), started_at=start)
    _shared(http, agent, start, 420)
    rollup_once(ctx)
    evaluate_once(ctx)
    clock.advance(31 * 60)
    _shared(http, agent, clock() - timedelta(minutes=31), 186)
    rollup_once(ctx)
    evaluate_once(ctx)
    firing = http.get("/api/v1/alerts?state=firing", headers=auth(tokens["reader"])).json()
    keys = {(a["policy"], a["scope_key"]) for a in firing}
    assert ("allocated-idle-gpu", f"job:{IDLE_JOB}") in keys
    assert ("allocated-idle-gpu", f"job:{BUSY_JOB}") not in keys
