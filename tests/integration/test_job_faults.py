"""A job whose GPU hit a hardware XID or fell off the bus says so: GET /jobs/{id}, `gpuwarden
job` and the job's report row name the node, GPU index, XID code and time, with the dollars of
the time the job held the GPU lost; on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, insert, update

from service.cli.fleet import job_report
from service.db.schema import gpus, prices
from tests.alerting_support import add_job, auth
from tests.integration.cost_data import roll_up, store_series
from tests.support import FakeClock

BUSY = {"sm_active": 0.9, "tensor_active": 0.8, "gr_engine_active": 0.95}


def _job(http: httpx.Client, tokens: dict[str, str], job_id: str) -> dict[str, Any]:
    r = http.get(f"/api/v1/jobs/{job_id}", headers=auth(tokens["reader"]))
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_a_hardware_xid_and_a_lost_gpu_are_named_with_the_lost_dollars(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock
) -> None:
    start = clock() - timedelta(minutes=30)
    # GPU-f0: trains, XID 13 (an application's), then XID 79 at minute 10, then nothing more:
    # it fell off the bus; reported lost at minute 20 while the job still holds it.
    series = [BUSY] * 30 + [{**BUSY, "xid_last": 13}] + [BUSY] * 29 + [{**BUSY, "xid_last": 79}]
    store_series(engine, clock, uuid="GPU-f0", start=start, metrics=series, index=3,
                 hostname="node-f")  # fmt: skip
    # GPU-f1: the same job's other GPU, healthy.
    store_series(engine, clock, uuid="GPU-f1", start=start, metrics=[BUSY] * 180, index=4,
                 hostname="node-f")  # fmt: skip
    roll_up(engine)
    add_job(engine, "slurm:77", ("GPU-f0", "GPU-f1"), started_at=start)
    with engine.begin() as conn:
        conn.execute(
            update(gpus)
            .where(gpus.c.uuid == "GPU-f0")
            .values(lost_at=start + timedelta(minutes=20))
        )
        conn.execute(
            insert(prices).values(model_pattern="*H100*", usd_per_gpu_hour=4.0,
                                  effective_from=start - timedelta(days=1))
        )  # fmt: skip
    job = _job(http, tokens, "slurm:77")
    faults = job["faults"]
    assert [(f["node"], f["gpu_index"], f["kind"], f["xid"]) for f in faults] == [
        ("node-f", 3, "xid", 79),
        ("node-f", 3, "lost", None),
    ]
    assert _at(faults[0]["at"]) == start + timedelta(seconds=600)  # the sample, not its minute
    lost = faults[1]
    assert _at(lost["at"]) == start + timedelta(seconds=600)  # its last sample
    assert _at(lost["lost_at"]) == start + timedelta(minutes=20)
    # The job held the lost GPU from minute 20 to now (minute 30): 600 s at $4.00/h.
    assert lost["lost_seconds"] == pytest.approx(600.0)
    assert lost["lost_usd"] == pytest.approx(600 * 4.0 / 3600)
    text = job_report(job, now=clock())
    assert "HARDWARE FAULT:" in text
    assert "node-f GPU 3: hardware XID 79 at " in text
    assert "node-f GPU 3: fell off the bus" in text and "$0.67" in text

    # The job's row of the cost report says the same, in JSON and in CSV.
    reader = auth(tokens["reader"])
    params = {"group_by": "job", "start": "-1h", "end": "now"}
    report = http.get("/api/v1/reports/cost", params=params, headers=reader).json()
    row = next(r for r in report["rows"] if r["key"] == "slurm:77")
    assert [(f["node"], f["gpu_index"], f["kind"], f["xid"]) for f in row["faults"]] == [
        ("node-f", 3, "xid", 79),
        ("node-f", 3, "lost", None),
    ]
    assert row["faults"][1]["lost_usd"] == pytest.approx(600 * 4.0 / 3600)
    csv_text = http.get(
        "/api/v1/reports/cost", params={**params, "format": "csv"}, headers=reader
    ).text
    lines = list(csv.DictReader(io.StringIO(csv_text)))
    cell = next(r for r in lines if r["job"] == "slurm:77")["hardware_faults"]
    assert cell.startswith("node-f GPU 3 XID 79 at ") and "node-f GPU 3 lost at " in cell


def test_an_application_xid_or_a_fault_outside_the_job_is_not_its_fault(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock
) -> None:
    start = clock() - timedelta(minutes=30)
    series = [{**BUSY, "xid_last": 13}] + [BUSY] * 58 + [{**BUSY, "xid_last": 79}] + [BUSY] * 120
    store_series(engine, clock, uuid="GPU-g0", start=start, metrics=series)
    roll_up(engine)
    # The job starts after the hardware XID (minute 10): only an XID 13 fell in it, before.
    add_job(engine, "slurm:78", ("GPU-g0",), started_at=start + timedelta(minutes=15))
    job = _job(http, tokens, "slurm:78")
    assert job["faults"] == []
    assert "HARDWARE FAULT" not in job_report(job, now=clock())
