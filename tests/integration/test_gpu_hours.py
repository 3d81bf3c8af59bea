"""GPU-hours beside dollars on every surface (the cost report's JSON and CSV, a job's page, the
jobs list, the fleet), and a site without prices (GPUWARDEN_PRICES=none) counting in GPU-hours,
not $0; on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from service.settings import Settings
from tests.integration.cost_data import money_example_metrics, roll_up, store_series
from tests.support import FakeClock, auth, iso

T0 = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)  # the clock stands at 08:00
# The money model's worked example: 30 min idle holding memory, 20 min fp32 without tensor
# cores (on an H100 the fix saves SM 0.96 x (1 - 1/11.7) of it: the speed-up measured there,
# service.costs.recoverable.GPU_PEAKS), 10 min no data.
SHARE = 0.96 * (1 - 7.32 / 85.49)
WASTE_GPU_HOURS = (1800 + 1200 * SHARE) / 3600


def put_h100_price(http: httpx.Client, tokens: dict[str, str]) -> None:
    rows = [{"model_pattern": "*H100*", "usd_per_gpu_hour": 4.0, "effective_from": iso(T0)}]
    http.put("/api/v1/prices", json=rows, headers=auth(tokens["admin"])).raise_for_status()


def post_job(http: httpx.Client, tokens: dict[str, str], job_id: str, minutes: float) -> None:
    body = {"id": job_id, "gpus": ["GPU-a0"], "started_at": iso(T0),
            "ended_at": iso(T0 + timedelta(minutes=minutes))}  # fmt: skip
    http.post("/api/v1/jobs", json=body, headers=auth(tokens["admin"])).raise_for_status()


def report(http: httpx.Client, tokens: dict[str, str], **params: str) -> dict[str, Any]:
    window = {"start": iso(T0), "end": iso(T0 + timedelta(hours=1))}
    r = http.get("/api/v1/reports/cost", params=window | params, headers=auth(tokens["reader"]))
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


@pytest.fixture
def money_hour(engine: Engine, clock: FakeClock) -> None:
    """GPU-a0 (an H100) with the money model's worked example over 06:00-07:00, rolled up."""
    store_series(engine, clock, uuid="GPU-a0", start=T0, metrics=money_example_metrics())
    roll_up(engine)


def test_gpu_hours_stand_beside_dollars_on_every_surface(
    http: httpx.Client, tokens: dict[str, str], money_hour: None
) -> None:
    put_h100_price(http, tokens)
    post_job(http, tokens, "slurm:9", 60)
    job = http.get("/api/v1/jobs/slurm:9", headers=auth(tokens["reader"])).json()["summary"]
    assert job["cost_usd"] == pytest.approx(4.0)
    assert job["held_gpu_hours"] == pytest.approx(1.0)
    # The same model as the dollars: waste GPU-hours x $4 = waste USD.
    assert job["waste_gpu_hours"] == pytest.approx(WASTE_GPU_HOURS)
    assert job["idle_gpu_hours"] == pytest.approx(0.5)
    assert job["fixable_gpu_hours"] == pytest.approx(1200 * SHARE / 3600)
    assert job["waste_gpu_hours"] * 4.0 == pytest.approx(job["waste_usd"])

    rep = report(http, tokens)
    assert rep["unit"] == "usd" and rep["price_source"] == "api"
    (row,) = [r for r in rep["rows"] if r["key"] == "slurm:9"]
    assert row["held_gpu_hours"] == pytest.approx(1.0)
    assert row["waste_gpu_hours"] == pytest.approx(WASTE_GPU_HOURS)
    assert rep["totals"]["waste_gpu_hours"] == pytest.approx(WASTE_GPU_HOURS)

    text = report_csv(http, tokens)
    (line,) = [r for r in csv.DictReader(io.StringIO(text)) if r["job"] == "slurm:9"]
    assert float(line["held_gpu_hours"]) == pytest.approx(1.0)
    assert float(line["waste_gpu_hours"]) == pytest.approx(WASTE_GPU_HOURS)
    assert float(line["waste_usd"]) == pytest.approx(4.0 * WASTE_GPU_HOURS)

    listed = http.get(
        "/api/v1/jobs", params={"start": iso(T0), "end": iso(T0 + timedelta(hours=1))},
        headers=auth(tokens["reader"]),
    ).json()  # fmt: skip
    (item,) = [j for j in listed if j["id"] == "slurm:9"]
    assert item["waste_gpu_hours"] == pytest.approx(WASTE_GPU_HOURS)

    fleet = http.get("/api/v1/fleet", headers=auth(tokens["reader"])).json()
    (gpu,) = [g for g in fleet["gpus"] if g["uuid"] == "GPU-a0"]
    # Today so far: 06:00-08:00 held (the second hour no job's, with no data).
    assert gpu["held_gpu_hours"] == pytest.approx(2.0, abs=0.05)
    assert gpu["waste_gpu_hours"] == pytest.approx(WASTE_GPU_HOURS, rel=0.02)
    assert fleet["waste_gpu_hours"] == pytest.approx(gpu["waste_gpu_hours"])


def report_csv(http: httpx.Client, tokens: dict[str, str]) -> str:
    window = {"start": iso(T0), "end": iso(T0 + timedelta(hours=1)), "format": "csv"}
    r = http.get("/api/v1/reports/cost", params=window, headers=auth(tokens["reader"]))
    assert r.status_code == 200, r.text
    return r.text


class TestNoPrices:
    """GPUWARDEN_PRICES=none: the unit is GPU-hours, dollars are null (never $0)."""

    @pytest.fixture
    def settings(self, engine: Engine) -> Settings:
        return Settings(
            database_url=str(engine.url.render_as_string(hide_password=False)),
            run_scheduler=False,
            prices="none",
        )

    def test_a_site_without_prices_counts_in_gpu_hours(
        self, http: httpx.Client, tokens: dict[str, str], money_hour: None
    ) -> None:
        put_h100_price(http, tokens)  # a stored table does not price a site that said none
        post_job(http, tokens, "short", 20)  # 20 min idle held: 0.33 GPU-h waste
        body = {"id": "long", "gpus": ["GPU-a0"], "started_at": iso(T0 + timedelta(minutes=20)),
                "ended_at": iso(T0 + timedelta(minutes=60))}  # fmt: skip
        http.post("/api/v1/jobs", json=body, headers=auth(tokens["admin"])).raise_for_status()
        rep = report(http, tokens)
        assert rep["unit"] == "gpu_hours" and rep["price_source"] == "none"
        rows = {r["key"]: r for r in rep["rows"]}
        for r in [*rows.values(), rep["totals"]]:
            assert r["cost_usd"] is None and r["waste_usd"] is None  # not $0
        assert rep["totals"]["held_gpu_hours"] == pytest.approx(1.0)
        assert rep["totals"]["waste_gpu_hours"] == pytest.approx(WASTE_GPU_HOURS)
        # long: 10 min idle + 20 min fp32 (x share); short: 20 min idle: long wastes more.
        assert rows["long"]["waste_gpu_hours"] == pytest.approx((600 + 1200 * SHARE) / 3600)
        assert rows["short"]["waste_gpu_hours"] == pytest.approx(1 / 3)
        assert [r["key"] for r in rep["rows"]] == ["long", "short"]  # by waste GPU-hours
        assert rep["warnings"] == [
            "no prices (GPUWARDEN_PRICES=none): figures are GPU-hours (held, waste = idle + "
            "fixable); every *_usd is null"
        ]
        assert http.get("/api/v1/prices", headers=auth(tokens["reader"])).json() == []
        job = http.get("/api/v1/jobs/long", headers=auth(tokens["reader"])).json()["summary"]
        assert job["cost_usd"] is None
        assert job["waste_gpu_hours"] == pytest.approx(rows["long"]["waste_gpu_hours"])
        fleet = http.get("/api/v1/fleet", headers=auth(tokens["reader"])).json()
        assert fleet["price_source"] == "none"
        assert fleet["cost_usd"] is None and fleet["waste_usd"] is None  # null, not $0
        assert fleet["waste_gpu_hours"] == pytest.approx(WASTE_GPU_HOURS, rel=0.02)
        assert fleet["gpus"][0]["cost_usd"] is None
        assert fleet["gpus"][0]["waste_gpu_hours"] == pytest.approx(WASTE_GPU_HOURS, rel=0.02)
