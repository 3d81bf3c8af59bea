"""``GET /api/v1/fleet`` (the console's first page): every GPU with what it wasted today, the
same dollars as the cost report grouped by GPU, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from sqlalchemy import insert

from service.db.schema import prices
from service.scheduler import rollup_once
from tests.alerting_support import add_job, auth, ingest
from tests.support import FakeClock


def test_fleet_wasted_today_matches_the_cost_report(
    app, http: httpx.Client, tokens, engine, clock: FakeClock
) -> None:
    start = clock() - timedelta(minutes=30)
    # GPU-a0 half busy for 30 minutes inside a job, GPU-a1 idle and in no job, GPU-a2 unpriced.
    ingest(http, tokens["agent"], start=start, count=180, metrics={"sm_active": 0.5},
           gpu_uuids=("GPU-a0",))  # fmt: skip
    ingest(http, tokens["agent"], start=start, count=180, metrics={"sm_active": 0.0},
           gpu_uuids=("GPU-a0", "GPU-a1"))  # fmt: skip
    add_job(engine, "j1", ("GPU-a0",), started_at=start)
    clock.advance(60)
    rollup_once(app.state.ctx)
    with engine.begin() as conn:
        conn.execute(
            insert(prices).values(
                model_pattern="*H100*",
                usd_per_gpu_hour=4.0,
                effective_from=start - timedelta(days=1),
            )
        )
    fleet = http.get("/api/v1/fleet", headers=auth(tokens["reader"]))
    assert fleet.status_code == 200, fleet.text
    body = fleet.json()
    report = http.get(
        "/api/v1/reports/cost",
        params={"group_by": "gpu", "start": "today", "end": "now"},
        headers=auth(tokens["reader"]),
    ).json()
    by_report = {r["key"]: r["unused_cost_usd"] for r in report["rows"]}
    gpus = {g["uuid"]: g for g in body["gpus"]}
    assert set(gpus) == {"GPU-a0", "GPU-a1"}
    assert gpus["GPU-a0"]["job"] == "j1" and gpus["GPU-a1"]["job"] is None
    for uuid, gpu in gpus.items():
        assert gpu["wasted_today_usd"] == pytest.approx(by_report[uuid], abs=0.02), uuid
    assert gpus["GPU-a1"]["wasted_today_usd"] > gpus["GPU-a0"]["wasted_today_usd"] > 0
    assert body["wasted_today_usd"] == pytest.approx(sum(by_report.values()), abs=0.04)
    assert body["start"].startswith("2026-12-02T00:00:00")
    assert body["price_source"] == "api"
    assert http.get("/api/v1/fleet", headers=auth(tokens["agent"])).status_code == 403
