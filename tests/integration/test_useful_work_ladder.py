"""The shipped sham-gpu policy and its dry-run ladder on both stores, every minute's round as
the leader runs it every 30 s (the agent's batch, rollup, evaluation, ladder, send, and the
useful-work job):
a job whose GPU runs a keep-alive loop, its host side read and nothing read or written, for
longer than the hold time fires and its ladder records a "would warn" step whose notice names
the evidence in plain words (the newest samples, not judged yet, do not restart it); a job with the same GPU pattern whose host side the agent could
not read is `unverified` and never gets a ladder step."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine

from service.core.useful_work import Kind
from service.db import policies_repo
from service.thresholds.default_policies import default_policies
from service.thresholds.policy import parse_channel
from service.usecases import ingest as ingest_service
from service.usecases.useful_work import judge_once, useful_work_once
from service.wire import IngestBatch
from tests.alerting_support import add_job
from tests.ladder_support import LadderWorld, RecordingDriver
from tests.receivers import Receiver
from tests.support import KEEP_ALIVE, FakeClock, iso

T0 = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
SHAM, BLIND = "GPU-sham", "GPU-blind"  # the host side read; the host side not readable
SHAM_JOB, BLIND_JOB = "slurm:500", "slurm:501"


def half_minute_batch(m: int) -> dict[str, Any]:
    """Half-minute ``m`` after T0: three 10 s samples of the loop on both GPUs; the processes'
    host side (CPU ticking, nothing read or written) on the sham GPU only."""
    samples, procs = [], []
    for k in range(3 * m, 3 * m + 3):
        ts = iso(T0 + timedelta(seconds=10 * k))
        for uuid in (SHAM, BLIND):
            samples.append({"gpu_uuid": uuid, "ts": ts, "metrics": KEEP_ALIVE})
        procs.append({
            "gpu_uuid": SHAM, "ts": ts, "pid": 100, "host_cpu_seconds": 0.5 * k,
            "host_read_bytes": 10_000, "host_write_bytes": 500,
            "host_voluntary_switches": 20 * k, "host_children": 0,
        })  # fmt: skip
        procs.append({"gpu_uuid": BLIND, "ts": ts, "pid": 101})
    return {
        "node": {"hostname": "node-a", "labels": {}},
        "gpus": [
            {"uuid": u, "index": i, "model": "NVIDIA H100 80GB HBM3", "fb_total_bytes": 80 * 2**30}
            for i, u in enumerate((SHAM, BLIND))
        ],
        "samples": samples,
        "processes": procs,
    }


@pytest.fixture
def world(app: Any, engine: Engine, clock: FakeClock, receiver: Receiver) -> LadderWorld:
    w = LadderWorld(app.state.ctx, engine, clock, receiver, {"slurm": RecordingDriver()})
    w.ctx.settings.webhook_allow_nets = "127.0.0.0/8"
    channel = parse_channel({"name": "owners", "type": "webhook", "url": receiver.url})
    shipped = {p.name: p for p in default_policies(channels=["owners"])}
    with engine.begin() as conn:
        policies_repo.put_channel(conn, channel=channel, source="api", now=T0)
        for name in ("sham-gpu", "hung-gpu"):
            policies_repo.put_policy(conn, policy=shipped[name], source="api", now=T0)
    return w


def test_a_keep_alive_loop_gets_a_dry_run_step_naming_its_evidence_and_unverified_none(
    world: LadderWorld,
) -> None:
    ctx, clock = world.ctx, world.clock
    shipped = {p.name: p for p in default_policies(channels=["owners"])}["sham-gpu"]
    assert shipped.ladder is not None and shipped.ladder.dry_run
    for m in range(100):  # 50 minutes, a batch and a round every 30 s (the eval interval)
        clock.set(T0 + timedelta(seconds=30 * (m + 1) + 1))  # the batch arrives
        batch = IngestBatch.model_validate(half_minute_batch(m))
        ingest_service.ingest(ctx, batch, token_node="node-a")
        if m == 0:
            add_job(world.engine, SHAM_JOB, (SHAM,), started_at=T0)
            add_job(world.engine, BLIND_JOB, (BLIND,), started_at=T0)
        # The leader's round before the useful-work job: the newest samples still carry their
        # per-sample cause (compute_no_tensor), which is no "busy again".
        world.round()
        useful_work_once(ctx)
        if m == 40:
            judged = {j.gpu_uuid: j.verdict for j in judge_once(world.engine, ctx.settings,
                                                                now=clock())}  # fmt: skip
            assert judged[SHAM].kind is Kind.SHAM
            assert judged[BLIND].kind is Kind.UNVERIFIED
            assert "no /proc readings" in judged[BLIND].words
    assert world.actions(SHAM_JOB) == [("notify_owner", "would")]
    assert world.actions(BLIND_JOB) == []
    assert world.drivers["slurm"].calls == []  # type: ignore[attr-defined]
    (notice,) = world.notices()
    text = notice["notice"]
    assert text.startswith(f"[dry run] Would warn now. Job {SHAM_JOB} (alice) has been sham"), text
    assert "Top cause: sham." in text
    evidence = text.split(" Evidence: ", 1)[1].split(". Waste so far", 1)[0]
    assert evidence.startswith("the GPU has been held at a flat 50% duty cycle"), text
    assert "for 10 minutes" in evidence and "no data was read or written (0 KiB)" in evidence
    assert "memory held flat at 2" in evidence and "no progress reported" in evidence
