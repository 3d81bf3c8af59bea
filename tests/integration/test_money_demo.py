"""The money model on `gpuwarden demo`'s fleet: 3 simulated nodes x 5 H100s at $4.00/GPU-hour
(every scenario, one of them an XID then off the bus), an hour of history shipped by real
agents to a real central on SQLite and PostgreSQL.

Every job's waste is the sum of its fixes' savings to the cent; the no-tensor and memory-bound
jobs rank by their fixable dollars; the fleet's covered hour costs 15 x $4.00 within 0.5%, the
lost GPU's time a line of its own and never waste.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, insert, select

from service.collectors.agent import backfill
from service.collectors.simulated import SCENARIO_CAUSES, SCENARIOS, SimulatedBackend
from service.db.schema import alerts, gpus, prices
from service.local.demo import replay_alerts
from service.local.launcher import DEMO_PRICE_USD_PER_GPU_HOUR, install_default_alerting
from service.usecases.upkeep import observed_jobs_once, rollup_once
from tests.agent_support import Wire, make_agent
from tests.conftest import make_token
from tests.support import FakeClock, iso

NODES, GPUS, MINUTES = 3, 5, 60
CENT = 0.005


@pytest.fixture
def demo(app: Any, server: str, engine: Engine, clock: FakeClock, tmp_path: Path) -> dict[str, Any]:
    """The demo's fleet as `gpuwarden demo` builds it, its hour shipped; the jobs by scenario."""
    end = clock()
    start = end - timedelta(minutes=MINUTES)
    with engine.begin() as conn:
        conn.execute(
            insert(prices).values(
                model_pattern="*H100*",
                usd_per_gpu_hour=DEMO_PRICE_USD_PER_GPU_HOUR,
                effective_from=start - timedelta(days=1),
            )
        )
    jobs: dict[str, str] = {}
    for i in range(NODES):
        hostname = f"demo-node-{i}"
        scenarios = [SCENARIOS[(i * GPUS + k) % len(SCENARIOS)] for k in range(GPUS)]
        backend = SimulatedBackend(
            hostname=hostname, gpus=GPUS, seed=i, scenarios=scenarios, start=start,
            xid_after_seconds=MINUTES * 60 * 0.75,
            job_base=1000 + 100 * i,
        )  # fmt: skip
        for k, scenario in enumerate(scenarios):
            job = backend.job_of(k)
            if job is not None:
                jobs.setdefault(scenario, job)
        (tmp_path / hostname).mkdir()
        agent = make_agent(
            tmp_path / hostname, url=server, token=make_token(engine, "agent", hostname),
            clock=clock, backend=backend, wire=Wire(), hostname=hostname,
        )  # fmt: skip
        backfill(agent, start=start, end=end, step_seconds=10, per_batch=60)
        agent.close()
    observed_jobs_once(app.state.ctx)
    rollup_once(app.state.ctx)
    reader = {"Authorization": f"Bearer {make_token(engine, 'reader')}"}
    return {"start": start, "end": end, "jobs": jobs, "reader": reader}


def test_every_demo_job_wastes_the_sum_of_its_fixes_savings_to_the_cent(
    http: httpx.Client, demo: dict[str, Any]
) -> None:
    for scenario, job_id in demo["jobs"].items():
        job = http.get(f"/api/v1/jobs/{job_id}", headers=demo["reader"]).json()
        s = job["summary"]
        fixes = job["recommendations"]
        # A MIG slice, where offered, prices the time the other fixes leave: beyond the waste.
        saved = sum(f["saving_usd"] for f in fixes if f["kind"] != "mig")
        assert round(saved, 2) == round(s["waste_usd"], 2), (scenario, s["waste_usd"], fixes)
        assert s["waste_usd"] == pytest.approx(s["idle_usd"] + s["fixable_usd"])
        assert s["waste_usd"] <= s["cost_usd"] + 1e-9
        parts = sum(c["usd"] for c in s["causes"].values()) + s["nodata_usd"] + s["lost_usd"]
        assert parts == pytest.approx(s["cost_usd"])
        if SCENARIO_CAUSES[scenario] == "compute_tensor":
            assert s["fixable_usd"] == pytest.approx(0.0, abs=CENT), scenario  # healthy


def test_the_no_tensor_and_memory_bound_jobs_rank_by_their_fixable_dollars(
    http: httpx.Client, demo: dict[str, Any]
) -> None:
    params = {"start": iso(demo["start"]), "end": iso(demo["end"]), "group_by": "job"}
    rows = http.get("/api/v1/reports/cost", params=params, headers=demo["reader"]).json()["rows"]
    wastes = [r["waste_usd"] for r in rows]
    assert wastes == sorted(wastes, reverse=True)
    rank = {r["key"]: i for i, r in enumerate(rows)}
    by_key = {r["key"]: r for r in rows}
    no_tensor, memory = demo["jobs"]["no-tensor"], demo["jobs"]["memory-bound"]
    training = demo["jobs"]["training"]
    # Busy SMs (efficiency 0.96): activity ranks them alike, their fixes' dollars do not.
    assert by_key[no_tensor]["efficiency"] > 0.9 and by_key[memory]["efficiency"] > 0.9
    for job_id, cause in ((no_tensor, "compute_no_tensor"), (memory, "memory_bound")):
        fix = next(f for f in by_key[job_id]["fixes"] if f["cause"] == cause)
        usd = by_key[job_id]["causes"][cause]["usd"]
        assert by_key[job_id]["fixable_usd"] == pytest.approx(usd * fix["saving_fraction"])
        assert by_key[job_id]["causes"][cause]["waste_usd"] == pytest.approx(fix["saving_usd"])
    assert by_key[no_tensor]["fixable_usd"] > by_key[memory]["fixable_usd"] > 0.5
    assert rank[no_tensor] < rank[memory] < rank[training]
    by_fixable = http.get(
        "/api/v1/reports/cost", params={**params, "sort": "fixable"}, headers=demo["reader"]
    ).json()["rows"]
    fixable = [r["fixable_usd"] for r in by_fixable]
    assert fixable == sorted(fixable, reverse=True)
    # No tensor cores saves 88% (11.7x, measured on an H100), memory-bound 50%.
    order = [r["key"] for r in by_fixable]
    assert order.index(no_tensor) < order.index(memory)
    # The job list ranks the same way, by the same figures.
    window = {"start": params["start"], "end": params["end"]}
    jobs = http.get("/api/v1/jobs", params=window, headers=demo["reader"]).json()
    assert [j["id"] for j in jobs] == [r["key"] for r in rows if r["key"] != "__unallocated__"]
    for j in jobs:
        assert j["waste_usd"] == pytest.approx(by_key[j["id"]]["waste_usd"], abs=CENT)


def test_the_fleets_covered_hour_costs_gpus_x_hours_x_price_with_lost_time_its_own_line(
    http: httpx.Client, demo: dict[str, Any]
) -> None:
    params = {"start": iso(demo["start"]), "end": iso(demo["end"]), "group_by": "gpu"}
    report = http.get("/api/v1/reports/cost", params=params, headers=demo["reader"]).json()
    t = report["totals"]
    gpus = NODES * GPUS
    assert t["gpus"] == gpus
    assert t["cost_usd"] == pytest.approx(gpus * 1.0 * DEMO_PRICE_USD_PER_GPU_HOUR, rel=0.005)
    # Each XID GPU fell off the bus with XID 79 at 45 minutes: its last sample (45:00, the
    # XID's) covers max_gap (60 s), the rest of the hour (840 s) is lost, not nodata.
    n_xid = sum(SCENARIOS[k % len(SCENARIOS)] == "xid-then-lost" for k in range(NODES * GPUS))
    lost_seconds = 15 * 60 - 60  # from 45:00 + max_gap to the end of the hour
    assert t["lost_seconds"] == pytest.approx(n_xid * lost_seconds, abs=1)
    assert t["lost_usd"] == pytest.approx(n_xid * lost_seconds / 3600 * 4.0, abs=CENT)
    assert t["nodata_usd"] < 0.01 * t["cost_usd"]
    parts = sum(c["usd"] for c in t["causes"].values()) + t["nodata_usd"] + t["lost_usd"]
    assert parts == pytest.approx(t["cost_usd"])
    assert t["waste_usd"] <= t["cost_usd"] - t["lost_usd"] + 1e-9
    lost = [r for r in report["rows"] if r["lost_seconds"] > 0]
    assert len(lost) == n_xid == 2
    assert sum(r["lost_usd"] for r in lost) == pytest.approx(t["lost_usd"])


def test_the_xid_jobs_page_names_the_fault_and_its_lost_dollars_are_the_bills(
    http: httpx.Client, demo: dict[str, Any]
) -> None:
    job = http.get(f"/api/v1/jobs/{demo['jobs']['xid-then-lost']}", headers=demo["reader"]).json()
    kinds = {f["kind"] for f in job["faults"]}
    assert {"xid", "lost"} <= kinds, job["faults"]
    (lost,) = [f for f in job["faults"] if f["kind"] == "lost"]
    (gpu,) = [g for g in job["per_gpu"] if g["gpu_uuid"] == lost["gpu_uuid"]]
    assert lost["lost_usd"] == pytest.approx(gpu["lost_usd"])
    assert lost["lost_seconds"] == pytest.approx(gpu["lost_seconds"])
    assert job["summary"]["lost_usd"] == pytest.approx(gpu["lost_usd"])
    assert job["summary"]["waste_usd"] <= job["summary"]["cost_usd"] - job["summary"]["lost_usd"]
    # The job held the GPU when it fell off the bus: the lost time is its bill (issue 50).
    assert lost["lost_seconds"] == pytest.approx(15 * 60 - 60, abs=1)
    assert lost["lost_usd"] == pytest.approx(840 / 3600 * DEMO_PRICE_USD_PER_GPU_HOUR, abs=CENT)


def test_lost_time_of_a_held_gpu_is_on_its_jobs_bill_not_unallocated(
    http: httpx.Client, demo: dict[str, Any]
) -> None:
    params = {"start": iso(demo["start"]), "end": iso(demo["end"]), "group_by": "job"}
    report = http.get("/api/v1/reports/cost", params=params, headers=demo["reader"]).json()
    by_key = {r["key"]: r for r in report["rows"]}
    assert by_key.get("__unallocated__", {}).get("lost_usd", 0.0) == 0.0
    xid_jobs = [k for k, r in by_key.items() if r["lost_seconds"] > 0]
    assert demo["jobs"]["xid-then-lost"] in xid_jobs
    assert sum(by_key[k]["lost_usd"] for k in xid_jobs) == pytest.approx(
        report["totals"]["lost_usd"]
    )
    assert report["totals"]["lost_usd"] > 0


def test_one_fault_is_one_alert_episode(app: Any, engine: Engine, demo: dict[str, Any]) -> None:
    # XID 79 and the loss that follows it are one fault: fired once, never resolved in between.
    install_default_alerting(engine, "http://127.0.0.1:9/sink")
    replay_alerts(app.state.ctx, start=demo["start"], end=demo["end"])
    with engine.connect() as conn:
        rows = conn.execute(
            select(alerts.c.gpu_uuid, alerts.c.state).where(alerts.c.policy == "gpu-hardware-fault")
        ).all()
        lost = set(conn.execute(select(gpus.c.uuid).where(gpus.c.lost_at.is_not(None))).scalars())
    assert len(lost) == 2
    assert sorted(rows) == sorted((uuid, "firing") for uuid in lost)
