"""A cost report read from rollups agrees with the waste model applied to raw samples (<= 1%)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, delete, insert, select

from service.costs.integrals import INTEGRAL_FIELDS, ActivityPoint, Thresholds, integrate
from service.costs.money import figures
from service.costs.prices import PriceRow
from service.costs.recommend import FixAssumptions
from service.costs.waste import UNALLOCATED, Allocation, Usage, plan_reads, segment_gpu, summarize
from service.db import jobs_repo, prices_repo
from service.db.costing import cost_sums
from service.db.schema import gpus, job_gpus, jobs, samples
from service.settings import Settings
from service.usecases.costing import cost_report
from service.usecases.job_summary import job_summary
from tests.integration.cost_data import GIB, roll_up, store_series
from tests.oracles import lines_from_segments
from tests.support import FakeClock

T0 = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)
HOURS = 3


def activity(k: int, phase: float) -> dict[str, float | int]:
    """A busy-then-idle pattern with noise, holding memory, deterministic."""
    sm = max(0.0, min(1.0, 0.5 + 0.5 * math.sin(k / 40 + phase) + 0.1 * math.sin(k * 7.3)))
    return {"sm_active": round(sm, 3), "fb_used_bytes": 3 * GIB, "power_watts": 300.0}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# Jobs with edges between samples and off minute boundaries; b and c share GPU-1 at once.
JOBS = {
    "a": ("GPU-0", at(437), at(10_500)),
    "b": ("GPU-1", at(1_234), at(9_000)),
    "c": ("GPU-1", at(3_333), at(5_555)),
}


@pytest.fixture
def fleet(engine: Engine, clock: FakeClock) -> None:
    n = HOURS * 360
    for i, uuid in enumerate(("GPU-0", "GPU-1")):
        metrics = [activity(k, i) for k in range(n)]
        # A 7-minute hole on GPU-0 (nodata) in the middle of job a.
        if uuid == "GPU-0":
            metrics = [m for k, m in enumerate(metrics) if not 300 <= k < 342]
            store_series(engine, clock, uuid=uuid, start=T0, metrics=metrics[:300], index=i)
            store_series(engine, clock, uuid=uuid, start=at(3420), metrics=metrics[300:], index=i)
        else:
            store_series(engine, clock, uuid=uuid, start=T0, metrics=metrics, index=i)
    roll_up(engine)
    with engine.begin() as conn:
        ids = dict(conn.execute(select(gpus.c.uuid, gpus.c.id)).all())
        for job_id, (uuid, start, end) in JOBS.items():
            conn.execute(
                insert(jobs).values(
                    id=job_id,
                    team=f"team-{job_id}",
                    labels={},
                    source="api",
                    started_at=start,
                    ended_at=end,
                    created_at=T0,
                    updated_at=T0,
                )
            )
            conn.execute(
                insert(job_gpus).values(
                    job_id=job_id, gpu_id=ids[uuid], started_at=start, ended_at=end, source="api"
                )
            )
        prices_repo.replace_prices(
            conn,
            rows=[
                PriceRow("*H100*", 4.0, T0 - timedelta(days=1)),
                PriceRow("*H100*", 3.0, at(9_000)),  # a price change inside jobs a and b
            ],
        )


def expected_from_raw(engine: Engine, start: datetime, end: datetime) -> dict[str, dict[str, Any]]:
    """The waste model applied directly to every raw sample (no rollups)."""
    th = Thresholds()
    prices = [PriceRow("*H100*", 4.0, T0 - timedelta(days=1)), PriceRow("*H100*", 3.0, at(9_000))]
    with engine.connect() as conn:
        ids = dict(conn.execute(select(gpus.c.id, gpus.c.uuid)).all())
        rows = conn.execute(select(samples).order_by(samples.c.gpu_id, samples.c.ts)).all()
    points: dict[int, list[ActivityPoint]] = {g: [] for g in ids}
    for r in rows:
        points[r.gpu_id].append(
            ActivityPoint(r.ts.timestamp(), r.activity, r.activity_rung, r.cause, r.power_watts)
        )
    by_uuid = {u: g for g, u in ids.items()}
    lines = []
    for gpu_id, uuid in ids.items():
        allocs = [Allocation(j, by_uuid[u], s, e) for j, (u, s, e) in JOBS.items() if u == uuid]
        # A GPU is held from its first sample (when it became known), costing from then.
        first = datetime.fromtimestamp(points[gpu_id][0].ts, UTC)
        segs = segment_gpu(gpu_id, allocs, max(start, first), end, [at(9_000)])
        usages = []
        for seg in segs:
            i = integrate(points[gpu_id], seg.start.timestamp(), seg.end.timestamp(), th)
            usages.append(Usage(**{f: getattr(i, f) for f in INTEGRAL_FIELDS}))
        lines += lines_from_segments(segs, usages, lambda s: 4.0 if s.start < at(9_000) else 3.0)
    assert prices  # the same table the database holds
    a = FixAssumptions()
    return {
        k: figures(s, a) for k, s in summarize(lines, lambda ln: ln.job_id or UNALLOCATED).items()
    }


FIELDS = (
    "allocated_seconds",
    "idle_seconds",
    "unused_seconds",
    "cost_usd",
    "waste_usd",
    "idle_usd",
    "fixable_usd",
    "nodata_usd",
    "energy_used_joules",
)


def assert_agree(
    got: dict[str, dict[str, Any]], want: dict[str, dict[str, Any]], rel: float
) -> None:
    """Each figure within ``rel`` of the group's scale: its allocated seconds, cost or energy."""
    assert set(got) == set(want)
    for key, row in want.items():
        for f in FIELDS:
            w, g = float(row[f]), float(got[key][f])
            if f.endswith("_usd"):
                scale = float(row["cost_usd"])
            elif f.endswith("_joules"):
                scale = w
            else:
                scale = float(row["allocated_seconds"])
            assert abs(g - w) <= rel * scale + 1e-6, (key, f, g, w)


def test_report_from_rollups_matches_raw_samples(engine: Engine, clock: FakeClock, fleet):
    start, end = at(-600), at(HOURS * 3600 + 600)
    want = expected_from_raw(engine, start, end)
    assert want["a"]["nodata_seconds"] > 300  # the hole is nodata, not idle
    with engine.connect() as conn:
        got = cost_report.cost_report(
            conn, settings=Settings(), start=start, end=end, now=clock(), group_by="job"
        )
    rows = {r["key"]: r for r in got["rows"]}
    # Job a's first price segment spans 04:00-05:00 whole, so an 1h bucket is read.
    assert "1h" in [r.kind for r in plan_reads(at(437), at(9_000))]
    # Reports take the seconds at job edges pro rata from their 1m bucket: within 1%.
    assert_agree(rows, want, rel=0.01)
    # b and c shared GPU-1 at once: their shares and the unallocated rest add to the GPU's time.
    assert rows["c"]["held_seconds"] == pytest.approx((5_555 - 3_333) / 2)


def test_report_after_raw_retention_agrees_within_one_percent(
    engine: Engine, clock: FakeClock, fleet
):
    start, end = at(-600), at(HOURS * 3600 + 600)
    want = expected_from_raw(engine, start, end)
    with engine.begin() as conn:
        conn.execute(delete(samples))  # retention dropped the raw data; rollups remain
    settings = Settings(retention_raw_days=0.01)  # so edges are read pro rata from 1m buckets
    with engine.connect() as conn:
        got = cost_report.cost_report(
            conn, settings=settings, start=start, end=end, now=clock(), group_by="job"
        )
    rows = {r["key"]: r for r in got["rows"]}
    assert_agree(rows, want, rel=0.01)
    total_want = sum(float(r["cost_usd"]) for r in want.values())
    assert got["totals"]["cost_usd"] == pytest.approx(total_want, rel=0.01)


def test_report_past_minute_retention_reads_the_same_bucket_by_bucket(
    engine: Engine, clock: FakeClock, fleet
):
    # Spans older than 1m retention are summed from 1h and 1m buckets instead of from the
    # running totals; both readings of the same rollups must give the same report.
    start, end = at(-600), at(HOURS * 3600 + 600)
    with engine.connect() as conn:
        by_totals = cost_report.cost_report(
            conn, settings=Settings(), start=start, end=end, now=clock(), group_by="job"
        )
        by_buckets = cost_report.cost_report(
            conn,
            settings=Settings(retention_1m_days=0.01),
            start=start,
            end=end,
            now=clock(),
            group_by="job",
        )
    assert by_totals["rows"] and len(by_totals["rows"]) == len(by_buckets["rows"])
    assert_agree(
        {r["key"]: r for r in by_buckets["rows"]},
        {r["key"]: r for r in by_totals["rows"]},
        rel=1e-6,
    )


@pytest.mark.parametrize("job_id", sorted(JOBS))
def test_job_summary_with_raw_edges_is_exact(engine: Engine, clock: FakeClock, fleet, job_id):
    # A job summary reads the seconds at its edges from raw samples and the rest from the
    # running totals: the waste model over raw samples, up to float error. Job c starts and
    # ends where GPU-1 has data on both sides; job a spans a hole and a price change.
    with engine.connect() as conn:
        job = jobs_repo.get_job(conn, job_id=job_id)
        assert job is not None
        summary = job_summary(conn, settings=Settings(), job=job, now=clock()).as_dict()
    want = expected_from_raw(engine, at(-600), at(HOURS * 3600 + 600))[job_id]
    assert_agree({job_id: summary["summary"]}, {job_id: want}, rel=1e-6)


def test_report_summed_on_two_connections_is_the_same(
    engine: Engine, clock: FakeClock, fleet, monkeypatch: pytest.MonkeyPatch
):
    # Big reports split their GPUs in two halves summed on two connections at once.
    start, end = at(-600), at(HOURS * 3600 + 600)
    with engine.connect() as conn:
        one = cost_report.cost_report(
            conn, settings=Settings(), start=start, end=end, now=clock(), group_by="job"
        )
        monkeypatch.setattr(cost_sums, "_PARALLEL_FROM", 0)
        two = cost_report.cost_report(
            conn, settings=Settings(), start=start, end=end, now=clock(), group_by="job"
        )
    assert {r["key"] for r in one["rows"]} == {"a", "b", "c", UNALLOCATED}
    assert_agree({r["key"]: r for r in two["rows"]}, {r["key"]: r for r in one["rows"]}, 1e-9)
