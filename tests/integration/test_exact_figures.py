"""Exact figures: samples stored seconds ago, or replayed late into minutes already rolled up,
count in a job summary and the cost report at once (read from raw samples until the rollup job
has run); on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest

from service.usecases.upkeep import rollup_once
from tests.alerting_support import add_job, auth
from tests.support import FakeClock, make_batch

METRICS = {"sm_active": 0.0, "gpu_util": 0.0, "fb_used_bytes": 20 * 2**30}  # idle, held


def post(http: httpx.Client, token: str, start: Any, count: int) -> None:
    batch = make_batch(start=start, count=count, metrics=METRICS)
    http.post("/api/v1/ingest", json=batch, headers=auth(token)).raise_for_status()


def summary(http: httpx.Client, token: str, job_id: str) -> dict[str, Any]:
    r = http.get(f"/api/v1/jobs/{job_id}", headers=auth(token))
    assert r.status_code == 200, r.text
    return r.json()["summary"]  # type: ignore[no-any-return]


def test_a_summary_read_seconds_after_ingest_counts_every_sample(
    app, http: httpx.Client, tokens, engine, clock: FakeClock
) -> None:
    """A 12-minute job whose 72 samples were just stored: 720 s with data, not 720 s of none."""
    start = clock() - timedelta(minutes=12)
    post(http, tokens["agent"], start, 72)
    add_job(engine, "j12", ("GPU-a0",), started_at=start)
    s = summary(http, tokens["reader"], "j12")  # the rollup job has not run
    assert s["allocated_seconds"] == pytest.approx(720, abs=0.5)
    assert s["nodata_seconds"] == pytest.approx(0, abs=0.5)
    assert s["causes"]["idle_held"]["seconds"] == pytest.approx(720, abs=0.5)
    report = http.get(
        "/api/v1/reports/cost", params={"since": "1h"}, headers=auth(tokens["reader"])
    ).json()
    (row,) = [r for r in report["rows"] if r["key"] == "j12"]
    assert row["allocated_seconds"] == pytest.approx(720, abs=0.5)
    # Once rolled up, the same figures.
    rollup_once(app.state.ctx)
    after = summary(http, tokens["reader"], "j12")
    assert after["allocated_seconds"] == pytest.approx(s["allocated_seconds"], abs=1e-6)
    assert after["unused_seconds"] == pytest.approx(s["unused_seconds"], abs=1e-6)


def test_a_spool_replayed_into_rolled_up_minutes_counts_at_once(
    app, http: httpx.Client, tokens, engine, clock: FakeClock
) -> None:
    """The middle 4 minutes of a 12-minute job arrive after the rest was rolled up."""
    start = clock() - timedelta(minutes=12)
    post(http, tokens["agent"], start, 24)  # minutes 0-4
    add_job(engine, "jspool", ("GPU-a0",), started_at=start)
    post(http, tokens["agent"], start + timedelta(minutes=8), 24)  # minutes 8-12
    rollup_once(app.state.ctx)
    gap = summary(http, tokens["reader"], "jspool")
    # The last sample (at 230 s) covers 60 s (max_gap); 290 s to 480 s has no data.
    assert gap["nodata_seconds"] == pytest.approx(190, abs=0.5)
    post(http, tokens["agent"], start + timedelta(minutes=4), 24)  # the replayed spool
    s = summary(http, tokens["reader"], "jspool")
    assert s["allocated_seconds"] == pytest.approx(720, abs=0.5)
    assert s["nodata_seconds"] == pytest.approx(0, abs=0.5)
    rollup_once(app.state.ctx)
    assert summary(http, tokens["reader"], "jspool")["allocated_seconds"] == pytest.approx(
        720, abs=0.5
    )


# Jobs of a minute to days on one GPU, starting and ending at odd seconds, sampled every 30 s
# with an activity that changes every sample (so pro rata edges would be off).
JOBS = [
    ("one-minute", timedelta(minutes=3, seconds=7), timedelta(minutes=1)),
    ("seven-minutes", timedelta(minutes=9, seconds=41), timedelta(minutes=7, seconds=13)),
    ("three-hours", timedelta(minutes=20, seconds=19), timedelta(hours=3, minutes=17, seconds=4)),
    ("two-days", timedelta(hours=4, seconds=53), timedelta(days=2, hours=5, seconds=17)),
]


def test_report_rows_equal_job_summaries_for_jobs_of_a_minute_to_days(
    engine, clock: FakeClock
) -> None:
    from service.db import jobs_repo
    from service.settings import Settings
    from service.usecases.costing.cost_report import cost_report
    from service.usecases.job_summary import job_summary
    from tests.integration.cost_data import roll_up, store_series

    t0 = clock() - timedelta(days=3)
    count = int(timedelta(days=3).total_seconds() // 30)
    metrics = [
        {"sm_active": (k * 37 % 100) / 100, "gpu_util": 0.5, "fb_used_bytes": 2**33}
        for k in range(count)
    ]
    store_series(engine, clock, uuid="GPU-x", start=t0, metrics=metrics, interval_seconds=30)
    roll_up(engine)
    for job_id, offset, length in JOBS:
        add_job(engine, job_id, ("GPU-x",), started_at=t0 + offset)
        with engine.begin() as conn:
            jobs_repo.end_job(conn, job_id=job_id, ended_at=t0 + offset + length, now=clock())
    settings = Settings(
        database_url=engine.url.render_as_string(hide_password=False), run_scheduler=False
    )
    with engine.connect() as conn:
        report = cost_report(
            conn, settings=settings, start=t0, end=clock(), now=clock(), group_by="job"
        )
        rows = {r["key"]: r for r in report["rows"]}
        for job_id, _, length in JOBS:
            job = jobs_repo.get_job(conn, job_id=job_id)
            assert job is not None
            s = job_summary(conn, settings=settings, job=job, now=clock()).summary
            row = rows[job_id]
            # Overlapping jobs share the GPU, so compare the report with the summary, not with
            # the job's length.
            for field in ("allocated_seconds", "unused_seconds", "idle_seconds", "cost_usd"):
                assert row[field] == pytest.approx(s[field], rel=0.005), (job_id, field)
            assert row["nodata_seconds"] == pytest.approx(s["nodata_seconds"], abs=0.5)
            assert s["held_seconds"] <= length.total_seconds() + 1e-6


def test_report_rows_equal_job_summaries_when_hundreds_of_jobs_have_recent_edges(
    engine, clock: FakeClock
) -> None:
    """A report over 600 jobs of a minute to 45 minutes on two GPUs (so more than 1,000 spans
    have an edge inside raw retention) beside jobs of hours and days on a third: each row equals
    its job's summary, edges read from raw samples in both."""
    import random

    from service.db import jobs_repo
    from service.settings import Settings
    from service.usecases.costing.cost_report import cost_report
    from service.usecases.job_summary import job_summary
    from tests.integration.cost_data import roll_up, store_series

    t0 = clock() - timedelta(days=3)
    count = int(timedelta(days=3).total_seconds() // 30)
    metrics = [
        {"sm_active": (k * 37 % 100) / 100, "gpu_util": 0.5, "fb_used_bytes": 2**33}
        for k in range(count)
    ]
    for index, uuid in enumerate(("GPU-x", "GPU-y", "GPU-z")):
        store_series(engine, clock, uuid=uuid, start=t0, metrics=metrics, interval_seconds=30,
                     index=index)  # fmt: skip
    roll_up(engine)
    ended: dict[str, Any] = {}
    for job_id, offset, length in JOBS:
        add_job(engine, job_id, ("GPU-x",), started_at=t0 + offset)
        ended[job_id] = t0 + offset + length
    rng = random.Random(7)
    for uuid in ("GPU-y", "GPU-z"):
        at = t0 + timedelta(seconds=rng.uniform(60, 600))
        for k in range(300):
            job_id = f"{uuid}-{k}"
            add_job(engine, job_id, (uuid,), started_at=at)
            ended[job_id] = at + timedelta(seconds=rng.choice((60, 61.5, 97, 431, 2700)))
            at = ended[job_id] + timedelta(seconds=rng.uniform(0, 300))
    assert at < clock()
    with engine.begin() as conn:
        for job_id, end in ended.items():
            jobs_repo.end_job(conn, job_id=job_id, ended_at=end, now=clock())
    settings = Settings(
        database_url=engine.url.render_as_string(hide_password=False), run_scheduler=False
    )
    with engine.connect() as conn:
        report = cost_report(
            conn, settings=settings, start=t0, end=clock(), now=clock(), group_by="job"
        )
        rows = {r["key"]: r for r in report["rows"]}
        for job_id in ended:
            job = jobs_repo.get_job(conn, job_id=job_id)
            assert job is not None
            s = job_summary(conn, settings=settings, job=job, now=clock()).summary
            row = rows[job_id]
            for field in ("allocated_seconds", "unused_seconds", "idle_seconds", "cost_usd"):
                assert row[field] == pytest.approx(s[field], rel=0.005), (job_id, field)
            assert row["nodata_seconds"] == pytest.approx(s["nodata_seconds"], abs=0.5)
            if job_id.startswith(("GPU-y", "GPU-z")):  # alone on its GPU: held all its length
                length = (ended[job_id] - job["started_at"]).total_seconds()
                assert s["held_seconds"] == pytest.approx(length, abs=1e-3)
