"""Three jobs share two GPUs with overlapping intervals: tenant rows per shared minute, each
job's own verdict, and costs that add up to the GPUs' to the cent, under every split rule."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, delete, func, insert, select

from service.context import ServiceContext
from service.costs.integrals import Thresholds
from service.costs.tenants import SplitRule
from service.db import jobs_repo, rollup_repo
from service.db.schema import gpus, job_gpus, jobs, prices, tenant_1m
from service.settings import Settings
from service.usecases import ingest as ingest_service
from service.usecases.costing.cost_report import cost_report
from service.wire import IngestBatch
from tests.support import FakeClock, iso

GIB = 1024**3
PRICE = 4.0
STEP = 10  # seconds between samples
MINUTES = 30
# (job, GPU, start minute, end minute, SM share of its process, memory held)
HOLDS = [
    ("job-a", "GPU-t0", 0.0, 20.0, 0.8, 2 * GIB),
    ("job-a", "GPU-t1", 10.0, 30.0, 0.8, 2 * GIB),
    ("job-b", "GPU-t0", 5.0, 30.0, 0.1, 2 * GIB),
    ("job-c", "GPU-t1", 0.0, 15.0, 0.0, 8 * GIB),  # the forgotten notebook: no kernels
    ("job-c", "GPU-t0", 12.5, 25.0, 0.0, 8 * GIB),  # joins mid-minute
]


def _store(engine: Engine, clock: FakeClock, t0: datetime) -> None:
    ctx = ServiceContext(
        settings=Settings(database_url="sqlite://", run_scheduler=False), engine=engine, clock=clock
    )
    samples: list[dict[str, Any]] = []
    procs: list[dict[str, Any]] = []
    for k in range(MINUTES * 60 // STEP):
        ts = t0 + timedelta(seconds=k * STEP)
        minute = k * STEP / 60
        for uuid in ("GPU-t0", "GPU-t1"):
            mine = [h for h in HOLDS if h[1] == uuid and h[2] <= minute < h[3]]
            busy = any(h[4] > 0 for h in mine)
            metrics = {
                "sm_active": 0.9 if busy else 0.0,
                "gr_engine_active": 0.95 if busy else 0.0,
                "gpu_util": 1.0 if busy else 0.0,
                "tensor_active": 0.85 if busy else 0.0,
                "dram_active": 0.1,
                "fb_used_bytes": sum(h[5] for h in mine) + GIB // 2,
                "power_watts": 500.0 if busy else 90.0,
            }
            samples.append({"gpu_uuid": uuid, "ts": iso(ts), "metrics": metrics})
            for n, h in enumerate(mine):
                procs.append(
                    {
                        "gpu_uuid": uuid,
                        "ts": iso(ts),
                        "pid": 1000 + HOLDS.index(h) * 10 + n,
                        "fb_used_bytes": h[5],
                        "job_id": h[0],
                        "sm_util": h[4] * 0.05,  # NVML's per-process share reads low
                        "mem_util": 0.01,
                    }
                )
    batch = {
        "node": {"hostname": "node-a", "labels": {}},
        "gpus": [
            {"uuid": u, "index": i, "model": "NVIDIA H100 80GB HBM3", "fb_total_bytes": 80 * GIB}
            for i, u in enumerate(("GPU-t0", "GPU-t1"))
        ],
        "samples": samples,
        "processes": procs,
    }
    ingest_service.ingest(ctx, IngestBatch.model_validate(batch), token_node="node-a")


def _jobs(engine: Engine, t0: datetime) -> None:
    with engine.begin() as conn:
        ids = dict(conn.execute(select(gpus.c.uuid, gpus.c.id)).all())
        # Ingest saw the jobs' processes and opened observed jobs; these are the registered ones.
        conn.execute(delete(job_gpus))
        conn.execute(delete(jobs))
        for job in sorted({h[0] for h in HOLDS}):
            conn.execute(
                insert(jobs).values(
                    id=job,
                    user=job,
                    team="ml",
                    project="p",
                    labels={},
                    source="api",
                    started_at=t0,
                    created_at=t0,
                    updated_at=t0,
                )
            )
        for job, uuid, s, e, _sm, _fb in HOLDS:
            conn.execute(
                insert(job_gpus).values(
                    job_id=job,
                    gpu_id=ids[uuid],
                    source="api",
                    started_at=t0 + timedelta(minutes=s),
                    ended_at=t0 + timedelta(minutes=e),
                )
            )
        conn.execute(
            insert(prices).values(
                model_pattern="*", usd_per_gpu_hour=PRICE, effective_from=t0 - timedelta(days=1)
            )
        )


def _roll_up(engine: Engine, rule: SplitRule) -> None:
    while True:
        with engine.begin() as conn:
            if rollup_repo.process_dirty(conn, thresholds=Thresholds(), split_rule=rule) == 0:
                return


@pytest.mark.parametrize("rule", list(SplitRule))
def test_three_jobs_two_gpus_reconcile_to_the_cent(
    engine: Engine, clock: FakeClock, settings: Settings, rule: SplitRule
) -> None:
    t0 = clock() - timedelta(minutes=40)
    _store(engine, clock, t0)
    _jobs(engine, t0)  # registered after ingest: the rollup still sees who held what
    _roll_up(engine, rule)
    settings.cost_split_rule = rule.value
    end = t0 + timedelta(minutes=MINUTES)
    with engine.connect() as conn:
        shared = conn.execute(select(func.count(func.distinct(tenant_1m.c.bucket_start)))).scalar()
        by_job = cost_report(
            conn, settings=settings, start=t0, end=end, now=clock(), group_by="job"
        )
        by_gpu = cost_report(
            conn, settings=settings, start=t0, end=end, now=clock(), group_by="gpu"
        )
    assert shared and shared >= 15  # GPU-t0 minutes 5-25 and GPU-t1 minutes 10-15 are shared
    assert by_job["split_rule"] == rule.value
    rows = {r["key"]: r for r in by_job["rows"]}
    gpu_cost = sum(r["cost_usd"] for r in by_gpu["rows"])
    # Both GPUs covered for 30 minutes at $4/h: $4.00, split without double counting.
    assert gpu_cost == pytest.approx(2 * PRICE * MINUTES / 60, abs=0.01)
    job_cost = sum(r["cost_usd"] for r in rows.values())
    assert round(job_cost, 2) == round(gpu_cost, 2)
    assert abs(job_cost - gpu_cost) < 0.005
    assert by_job["totals"]["cost_usd"] == pytest.approx(gpu_cost, abs=0.005)
    # The tenants' activity adds up to the GPUs' activity.
    unused_jobs = sum(r["unused_seconds"] for r in rows.values())
    unused_gpus = sum(r["unused_seconds"] for r in by_gpu["rows"])
    assert unused_jobs == pytest.approx(unused_gpus, rel=1e-6)
    a, b, c = rows["job-a"], rows["job-b"], rows["job-c"]
    # The notebook ran nothing: every second of it is idle_held, while the GPUs were busy.
    assert c["causes"]["compute_tensor"]["seconds"] == 0
    assert c["idle_held_seconds"] == pytest.approx(c["allocated_seconds"])
    assert a["causes"]["compute_tensor"]["seconds"] > 0
    assert b["causes"]["compute_tensor"]["seconds"] > 0
    if rule is SplitRule.EQUAL:
        # job-c: GPU-t1 alone 10 min, with job-a 5 min; GPU-t0 with a and b 7.5 min, with b 5 min
        assert c["allocated_seconds"] == pytest.approx(600 + 300 / 2 + 450 / 3 + 300 / 2, abs=11)
    if rule is SplitRule.ACTIVITY:
        # busy time by SM share: the notebook pays only for its GPU alone (minutes 0-10 on t1,
        # which nobody else held), the rest goes to the jobs that ran kernels
        assert c["allocated_seconds"] == pytest.approx(600, abs=11)
        assert a["cost_usd"] > b["cost_usd"]
    if rule is SplitRule.MEMORY:
        assert c["cost_usd"] > b["cost_usd"]  # 8 GiB against 2 GiB


def test_jobs_registered_after_the_rollup_still_get_their_tenant_rows(
    engine: Engine, clock: FakeClock, settings: Settings
) -> None:
    """Slurm's prolog can be late: registering (and ending) a job marks the minutes it shared
    for the rollup job again."""
    t0 = clock() - timedelta(minutes=40)
    _store(engine, clock, t0)
    with engine.begin() as conn:  # ingest's observed jobs are replaced by the registered ones
        conn.execute(delete(job_gpus))
        conn.execute(delete(jobs))
        conn.execute(
            insert(prices).values(
                model_pattern="*", usd_per_gpu_hour=PRICE, effective_from=t0 - timedelta(days=1)
            )
        )
    _roll_up(engine, SplitRule.MEMORY)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(tenant_1m)).scalar() == 0
    with engine.begin() as conn:
        for job, uuid, s, _e, _sm, _fb in HOLDS:
            jobs_repo.upsert_job(
                conn,
                job_id=job,
                fields={},
                gpu_uuids=[uuid],
                now=clock(),
                started_at=t0 + timedelta(minutes=s),
                ended_at=None,
            )
    _roll_up(engine, SplitRule.MEMORY)
    with engine.connect() as conn:
        open_minutes = conn.execute(
            select(func.count(func.distinct(tenant_1m.c.bucket_start)))
        ).scalar()
    assert open_minutes and open_minutes >= 25  # open intervals overlap to the last sample
    with engine.begin() as conn:  # job-c ends at minute 15: minutes after it are re-split
        jobs_repo.end_job(conn, job_id="job-c", ended_at=t0 + timedelta(minutes=15), now=clock())
    _roll_up(engine, SplitRule.MEMORY)
    settings.cost_split_rule = "memory"
    with engine.connect() as conn:
        later = conn.execute(
            select(func.count())
            .select_from(tenant_1m)
            .where(
                tenant_1m.c.tenant == "job-c",
                tenant_1m.c.bucket_start >= t0 + timedelta(minutes=15),
            )
        ).scalar()
        report = cost_report(
            conn,
            settings=settings,
            start=t0,
            end=t0 + timedelta(minutes=MINUTES),
            now=clock(),
            group_by="job",
        )
    assert later == 0
    total = sum(r["cost_usd"] for r in report["rows"])
    assert round(total, 2) == round(2 * PRICE * MINUTES / 60, 2)
    rows = {r["key"]: r for r in report["rows"]}
    assert rows["job-c"]["idle_held_seconds"] == pytest.approx(rows["job-c"]["allocated_seconds"])


@pytest.mark.parametrize("rule", list(SplitRule))
def test_a_window_that_cuts_shared_minutes_splits_their_parts_exactly(
    engine: Engine, clock: FakeClock, settings: Settings, rule: SplitRule
) -> None:
    """A report from minute 12.5 to 20.25: the parts of the two cut minutes are split from
    their raw samples, not as a share of the whole minute (which would halve job-c's first
    half minute, which it held alone with job-a and job-b)."""
    t0 = clock() - timedelta(minutes=40)
    _store(engine, clock, t0)
    _jobs(engine, t0)
    _roll_up(engine, rule)
    settings.cost_split_rule = rule.value
    start, end = t0 + timedelta(minutes=12.5), t0 + timedelta(minutes=20.25)
    with engine.connect() as conn:
        by_job = cost_report(conn, settings=settings, start=start, end=end, now=clock(),
                             group_by="job")  # fmt: skip
        by_gpu = cost_report(conn, settings=settings, start=start, end=end, now=clock(),
                             group_by="gpu")  # fmt: skip
    rows = {r["key"]: r for r in by_job["rows"]}
    gpu_cost = sum(r["cost_usd"] for r in by_gpu["rows"])
    assert gpu_cost == pytest.approx(2 * PRICE * 7.75 / 60, abs=1e-6)
    assert sum(r["cost_usd"] for r in rows.values()) == pytest.approx(gpu_cost, abs=1e-6)
    c = rows["job-c"]
    assert c["idle_held_seconds"] == pytest.approx(c["allocated_seconds"])
    if rule is SplitRule.EQUAL:
        # GPU-t0: with a and b to minute 20 (450 s / 3), then with b (15 s / 2); GPU-t1: with
        # a from 12.5 to 15 (150 s / 2).
        assert c["allocated_seconds"] == pytest.approx(450 / 3 + 15 / 2 + 150 / 2, abs=1e-6)
    if rule is SplitRule.ACTIVITY:
        assert c["allocated_seconds"] == pytest.approx(0.0, abs=1e-6)  # never ran a kernel
    if rule is SplitRule.MEMORY:
        # 8 GiB against 2 GiB each: 8/12 of GPU-t0 to minute 20, 8/10 after; 8/10 of GPU-t1.
        want = 450 * 8 / 12 + 15 * 8 / 10 + 150 * 8 / 10
        assert c["allocated_seconds"] == pytest.approx(want, abs=1e-6)
