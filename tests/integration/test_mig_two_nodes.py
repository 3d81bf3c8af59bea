"""MIG instances two nodes report at once (two agents reading the same exporters' output, as
through a Service without ``internalTrafficPolicy: Local``): each instance is stored under one
node and priced once, as a whole GPU two nodes report is.

Each agent names an instance with the time it first saw it (service.collectors.mig), so the two
agents' names differ; the real exporter captures are what both agents scrape.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, insert

from service.costs.integrals import Thresholds
from service.db import rollup_repo
from service.db.schema import prices
from tests.alerting_support import auth
from tests.exporter_support import DATA, exporter_agent, ship_at_once
from tests.support import FakeClock, iso

# 3 instances of an H100 and 6 of two A30s, every one a real exporter's series.
CAPTURES = ("h100-mig-kserve.prom", "a30-mig-dram.prom")
MINUTES = 30


def price(engine: Engine, clock: FakeClock) -> None:
    with engine.begin() as conn:
        for pattern, usd in (("NVIDIA H100*", 7.0), ("NVIDIA A30*", 2.0)):
            conn.execute(
                insert(prices).values(
                    model_pattern=pattern,
                    usd_per_gpu_hour=usd,
                    effective_from=clock() - timedelta(days=1),
                )
            )


def roll_up(engine: Engine) -> None:
    while True:
        with engine.begin() as conn:
            if rollup_repo.process_dirty(conn, thresholds=Thresholds()) == 0:
                return


def slot(uuid: str) -> str:
    """A MIG instance's parent and GPU instance id, whichever agent named it."""
    parent, gi, _ = uuid.removeprefix("MIG-").split("/", 2)
    return f"{parent}/{gi}"


def test_mig_instances_two_nodes_report_are_stored_and_priced_once(
    app: Any,
    engine: Engine,
    clock: FakeClock,
    http: httpx.Client,
    tokens: dict[str, str],
    tmp_path: Path,
) -> None:
    text = "".join((DATA / name).read_text() for name in CAPTURES)
    t0 = clock()
    agents = {  # node-b's agent started 7 s after node-a's: its names of the instances differ
        "node-a": exporter_agent(tmp_path / "a", text, "node-a", t0),
        "node-b": exporter_agent(tmp_path / "b", text, "node-b", t0 + timedelta(seconds=7)),
    }
    names = {n: {d.uuid for d in a.backend.devices()} for n, a in agents.items()}
    assert len(names["node-a"]) == 9 and not names["node-a"] & names["node-b"]
    try:
        last = ship_at_once(app.state.ctx, clock, agents, MINUTES)
    finally:
        for agent in agents.values():
            agent.close()
    assert last["node-a"].gpu_claims == [] and last["node-b"].samples_received == 0
    claims = last["node-b"].gpu_claims
    assert {c.gpu_uuid for c in claims} == names["node-b"] and not any(c.moved for c in claims)
    assert all(c.from_node == "node-a" for c in claims)
    assert (
        "its GPU GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77 is still reported by node 'node-a'"
        in (" ".join(c.reason for c in claims))
    )
    price(engine, clock)
    roll_up(engine)

    reader = auth(tokens["reader"])
    listed = http.get("/api/v1/gpus", headers=reader).json()
    assert sorted(slot(g["uuid"]) for g in listed) == sorted({slot(u) for u in names["node-a"]})
    assert {g["node"] for g in listed} == {"node-a"}  # the node that stored them first
    fleet = http.get("/api/v1/fleet", headers=reader).json()
    assert fleet["fleet_gpu_count"] == 9

    window = {"start": iso(t0), "end": iso(t0 + timedelta(minutes=MINUTES)), "group_by": "gpu"}
    report = http.get("/api/v1/reports/cost", params=window, headers=reader).json()
    assert sorted(slot(r["key"]) for r in report["rows"]) == sorted(slot(g["uuid"]) for g in listed)
    # Half an hour: each 1g.10gb is 1/7 of a $7 H100 ($0.50), each 1g.6gb 1/4 of a $2 A30.
    assert report["totals"]["cost_usd"] == pytest.approx(3 * 0.5 + 6 * 0.25, abs=0.02)
