"""Rollups computed from raw samples, late data re-rolled, and series read at the right resolution."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from sqlalchemy import Engine, select

from service.db.schema import rollup_1h, rollup_1m, rollup_dirty
from service.usecases.upkeep import rollup_once
from tests.support import FakeClock, auth, make_batch


def post(http: httpx.Client, token: str, batch: dict) -> None:  # type: ignore[type-arg]
    r = http.post("/api/v1/ingest", json=batch, headers=auth(token))
    assert r.status_code == 200, r.text


def test_rollups_carry_aggregates_and_integrals(
    app, http, tokens, engine: Engine, clock: FakeClock
):
    start = clock() - timedelta(hours=2)
    # 30 min idle holding 20 GiB, then 30 min at 0.8, sampled every 10 s (the worked example)
    post(
        http,
        tokens["agent"],
        make_batch(start=start, count=180, metrics={"sm_active": 0.0, "fb_used_bytes": 20 * 2**30}),
    )
    post(
        http,
        tokens["agent"],
        make_batch(
            start=start + timedelta(minutes=30),
            count=180,
            metrics={"sm_active": 0.8, "fb_used_bytes": 20 * 2**30},
        ),
    )
    n = rollup_once(app.state.ctx)
    assert n >= 60
    with engine.connect() as conn:
        assert conn.execute(select(rollup_dirty)).first() is None
        minutes = conn.execute(select(rollup_1m).order_by(rollup_1m.c.bucket_start)).all()
        hours = conn.execute(select(rollup_1h).order_by(rollup_1h.c.bucket_start)).all()
    assert len(minutes) == 61  # the last sample covers max_gap into the next minute
    first = minutes[0]
    assert first.sample_count == 6
    assert first.sm_active_count == 6 and first.sm_active_max == 0.0
    assert first.idle_held_seconds == pytest.approx(60)
    hour = minutes[:60]
    assert sum(m.covered_seconds for m in hour) == pytest.approx(3600)
    assert sum(m.unused_seconds for m in hour) == pytest.approx(0.6 * 3600)
    assert minutes[60].covered_seconds == pytest.approx(
        50
    )  # 07:00:00-07:00:50 from the last sample
    assert [h.unused_seconds for h in hours] == pytest.approx([0.6 * 3600, 50 * 0.2])
    assert hours[0].idle_seconds == pytest.approx(1800)
    assert hours[0].idle_held_seconds == pytest.approx(1800)
    assert hours[0].sample_count == 360
    assert hours[0].sm_active_sum / hours[0].sm_active_count == pytest.approx(0.4)


def test_late_samples_rerollup_their_buckets(app, http, tokens, engine: Engine, clock: FakeClock):
    start = (clock() - timedelta(hours=1)).replace(second=0)
    post(
        http,
        tokens["agent"],
        make_batch(start=start, count=3, interval_seconds=20, metrics={"sm_active": 1.0}),
    )
    rollup_once(app.state.ctx)
    with engine.connect() as conn:
        before = conn.execute(select(rollup_1m).where(rollup_1m.c.bucket_start == start)).one()
    assert before.sm_active_count == 3
    # the agent's spool replays a sample for the same minute later
    late = make_batch(start=start + timedelta(seconds=50), metrics={"sm_active": 0.0})
    post(http, tokens["agent"], late)
    rollup_once(app.state.ctx)
    with engine.connect() as conn:
        after = conn.execute(select(rollup_1m).where(rollup_1m.c.bucket_start == start)).one()
    assert after.sm_active_count == 4
    assert after.sm_active_min == 0.0
    assert after.unused_seconds == pytest.approx(10)  # 0:50-1:00 at 0.0


def test_series_picks_resolution_from_step(app, http, tokens, clock: FakeClock):
    start = (clock() - timedelta(hours=3)).replace(minute=0, second=0)
    post(
        http,
        tokens["agent"],
        make_batch(
            start=start,
            count=360,
            interval_seconds=30,
            metrics={"sm_active": 0.25, "power_watts": 300.0},
        ),
    )
    rollup_once(app.state.ctx)
    q = {
        "metric": "sm_active",
        "start": start.isoformat(),
        "end": (start + timedelta(hours=3)).isoformat(),
    }
    h = auth(tokens["reader"])
    raw = http.get("/api/v1/gpus/GPU-a0/series", params={**q, "step": 30}, headers=h).json()
    assert raw["resolution"] == "raw" and len(raw["points"]) == 360
    # step as Prometheus's HTTP API takes it: float seconds or a duration
    m = http.get("/api/v1/gpus/GPU-a0/series", params={**q, "step": "5m"}, headers=h).json()
    assert m["resolution"] == "1m" and len(m["points"]) == 36
    assert m["points"][0]["count"] == 10 and m["points"][0]["avg"] == pytest.approx(0.25)
    hr = http.get("/api/v1/gpus/GPU-a0/series", params={**q, "step": "3600.0"}, headers=h).json()
    assert hr["resolution"] == "1h" and [p["count"] for p in hr["points"]] == [120, 120, 120]
    assert hr["unit"] == "ratio"
    # The activity ladder reads like a metric, at every resolution.
    for step, resolution in ((30, "raw"), ("5m", "1m"), ("3600", "1h")):
        act = http.get(
            "/api/v1/gpus/GPU-a0/series",
            params={**q, "metric": "activity", "step": step},
            headers=h,
        ).json()
        assert act["resolution"] == resolution and act["unit"] == "ratio"
        assert [p["avg"] for p in act["points"]] == pytest.approx([0.25] * len(act["points"]))
        assert act["points"]
    for bad in ("1.5h", "30m1h", "0", "-5"):
        r = http.get("/api/v1/gpus/GPU-a0/series", params={**q, "step": bad}, headers=h)
        assert r.status_code == 422 and query_field(r) == "step", (bad, r.text)


def query_field(r: httpx.Response) -> str:
    """The query parameter a 422 names."""
    loc = r.json()["detail"][0]["loc"]
    assert loc[0] == "query"
    return str(loc[1])


def test_series_errors_name_the_parameter(http, tokens):
    h = auth(tokens["reader"])
    r = http.get("/api/v1/gpus/GPU-x/series", params={"metric": "sm_active"}, headers=h)
    assert r.status_code == 404 and "GPU-x" in r.json()["detail"]
    r = http.get("/api/v1/gpus/GPU-x/series", params={"metric": "sm_busy"}, headers=h)
    assert r.status_code == 422 and query_field(r) == "metric"
    r = http.get(
        "/api/v1/gpus/GPU-x/series",
        params={
            "metric": "sm_active",
            "start": "2026-12-02T09:00:00Z",
            "end": "2026-12-02T08:00:00Z",
        },
        headers=h,
    )
    assert r.status_code == 422 and query_field(r) == "start"
    r = http.get(
        "/api/v1/gpus/GPU-x/series",
        params={"metric": "sm_active", "start": "2026-12-02T08:00:00"},
        headers=h,
    )
    assert r.status_code == 422 and query_field(r) == "start"
    assert "timezone" in r.json()["detail"][0]["msg"]
