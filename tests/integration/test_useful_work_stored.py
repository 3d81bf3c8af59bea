"""The useful-work verdict on stored data, on SQLite and PostgreSQL: the processes' host side
is stored from the wire; a keep-alive loop's last hold time becomes sham in the samples, the
GPU's latest cause and the rollups; a GPU whose job read data, and a labelled benchmark, keep
their causes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, func, select, update

from service.context import ServiceContext
from service.core.diagnosis import Cause
from service.core.useful_work import EXEMPT_LABEL, Kind
from service.db.schema import gpu_processes, gpus, jobs, rollup_1m, samples
from service.settings import Settings
from service.usecases import ingest as ingest_service
from service.usecases.useful_work import job_evidence_words, judge_once
from service.wire import IngestBatch
from tests.alerting_support import add_job
from tests.integration.cost_data import roll_up
from tests.support import KEEP_ALIVE, FakeClock, iso

T0 = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
UUIDS = ("GPU-sham", "GPU-reader", "GPU-bench")


def batch(k: int) -> dict[str, Any]:
    ts = iso(T0 + timedelta(seconds=5 * k))
    procs = [
        {
            "gpu_uuid": u,
            "ts": ts,
            "pid": 100 + i,
            "host_cpu_seconds": 1.0 + 0.1 * k,
            # The reader's job reads 1 MB every 5 s; the others read nothing.
            "host_read_bytes": 10_000 + (1_000_000 * k if u == "GPU-reader" else 0),
            "host_write_bytes": 500,
            "host_voluntary_switches": 100 * k,
            "host_children": 0,
        }
        for i, u in enumerate(UUIDS)
    ]
    return {
        "node": {"hostname": "node-a", "labels": {}},
        "gpus": [
            {"uuid": u, "index": i, "model": "NVIDIA H100 80GB HBM3", "fb_total_bytes": 80 * 2**30}
            for i, u in enumerate(UUIDS)
        ],
        "samples": [{"gpu_uuid": u, "ts": ts, "metrics": KEEP_ALIVE} for u in UUIDS],
        "processes": procs,
    }


def test_a_keep_alive_loop_is_stored_as_sham(engine: Engine, clock: FakeClock) -> None:
    clock.set(T0 + timedelta(minutes=16))
    settings = Settings(database_url="sqlite://", run_scheduler=False, useful_work_hold_minutes=10)
    ctx = ServiceContext(settings=settings, engine=engine, clock=clock)
    for k in range(0, 15 * 12, 12):  # a batch a minute, 15 minutes of 5 s samples
        parts = [batch(j) for j in range(k, k + 12)]
        body = parts[0] | {
            "samples": [s for b in parts for s in b["samples"]],
            "processes": [p for b in parts for p in b["processes"]],
        }
        ingest_service.ingest(ctx, IngestBatch.model_validate(body), token_node="node-a")
    for u in UUIDS:
        add_job(engine, f"job-{u}", (u,), started_at=T0)
    with engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == "job-GPU-bench").values(
            labels={EXEMPT_LABEL: "burn-in"}))  # fmt: skip
        stored = conn.execute(
            select(func.count()).where(gpu_processes.c.host_read_bytes.is_not(None))
        ).scalar_one()
    assert stored == 3 * 15 * 12
    roll_up(engine)
    now = T0 + timedelta(minutes=15)
    judged = {j.gpu_uuid: j for j in judge_once(engine, settings, now=now)}
    assert judged["GPU-sham"].verdict.kind is Kind.SHAM
    assert "no data was read or written" in judged["GPU-sham"].verdict.words
    assert judged["GPU-reader"].verdict.kind is Kind.USEFUL
    assert judged["GPU-bench"].verdict.kind is Kind.EXEMPT
    assert judged["GPU-sham"].changed >= 110  # the 10 minutes' samples, 5 s apart
    roll_up(engine)
    with engine.connect() as conn:
        ids = dict(conn.execute(select(gpus.c.uuid, gpus.c.id)).all())
        causes = dict(
            conn.execute(
                select(samples.c.gpu_id, func.max(samples.c.cause))
                .where(samples.c.ts > now - timedelta(minutes=10))
                .group_by(samples.c.gpu_id)
            ).all()
        )
        sham_seconds = dict(
            conn.execute(
                select(rollup_1m.c.gpu_id, func.sum(rollup_1m.c.sham_seconds)).group_by(
                    rollup_1m.c.gpu_id
                )
            ).all()
        )
        latest = dict(conn.execute(select(gpus.c.uuid, gpus.c.last_cause)).all())
    assert causes[ids["GPU-sham"]] == int(Cause.SHAM)
    assert causes[ids["GPU-reader"]] == causes[ids["GPU-bench"]] != int(Cause.SHAM)
    # The 10 minutes ending at each sample judged (those of the last 90 s: an evaluation
    # interval and the longest gap a sample covers), from 3:35 to 14:55 after T0, and the last
    # sample covering 50 s past the series (max_gap 60 s).
    assert sham_seconds[ids["GPU-sham"]] == 685.0 + 50.0
    assert sham_seconds[ids["GPU-reader"]] == sham_seconds[ids["GPU-bench"]] == 0
    assert latest["GPU-sham"] == int(Cause.SHAM)
    # The ladder's notice for the job names the evidence in words; none for the others.
    said = job_evidence_words(ctx, "job-GPU-sham", now)
    assert said is not None and said.startswith("the GPU has been held at a flat 50% duty cycle")
    assert "no data was read or written" in said and "no progress reported" in said
    assert job_evidence_words(ctx, "job-GPU-reader", now) is None
    # Judged again: nothing more to change (idempotent).
    again = {j.gpu_uuid: j for j in judge_once(engine, settings, now=now)}
    assert again["GPU-sham"].changed == 0
