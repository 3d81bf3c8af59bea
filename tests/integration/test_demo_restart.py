"""Restarting `gpuwarden demo` on its database resumes the history, never rewrites it (issue 50).

The demo's fleet (3 nodes x 5 simulated H100s, one XID-then-lost GPU on two of them) ships its
hour, is stopped for 20 minutes and started again the way ``run_demo`` plans it, on SQLite and
PostgreSQL: a closed window reads the same dollars and the XID job keeps its fault.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine, insert

from service.collectors.agent import backfill
from service.db.schema import prices
from service.local.demo import DemoHistory, demo_jobs, register_jobs
from service.local.launcher import (
    DEMO_PRICE_USD_PER_GPU_HOUR,
    DemoFleet,
    demo_backend,
    demo_hostnames,
    plan_demo,
)
from service.usecases.upkeep import observed_jobs_once, rollup_once
from tests.agent_support import Wire, make_agent
from tests.conftest import make_token
from tests.support import FakeClock, iso

NODES, GPUS, MINUTES = 3, 5, 60
STEP = timedelta(seconds=10)
FIGURES = ("held_seconds", "cost_usd", "waste_usd", "nodata_usd", "lost_usd", "lost_seconds")


def start_demo(
    app: Any, server: str, engine: Engine, clock: FakeClock, folder: Path
) -> tuple[DemoFleet, DemoHistory]:
    """One `gpuwarden demo` start at ``clock()``: the fleet planned as run_demo plans it, its
    jobs registered and its history shipped by real agents."""
    fleet, history = plan_demo(
        engine,
        DemoFleet(NODES, GPUS, 0, clock() - timedelta(minutes=MINUTES), MINUTES),
        now=clock(),
        step=STEP,
    )
    backends = []
    for i, host in enumerate(demo_hostnames(NODES)):
        backend = demo_backend(fleet, i, host)
        backends.append(backend)
        (folder / host).mkdir(parents=True)
        agent = make_agent(
            folder / host, url=server, token=make_token(engine, "agent", host), clock=clock,
            backend=backend, wire=Wire(), hostname=host,
        )  # fmt: skip
        backfill(
            agent, start=history.backfill_from, end=history.now,
            step_seconds=STEP.total_seconds(), per_batch=60,
        )  # fmt: skip
        agent.close()
    register_jobs(engine, demo_jobs(backends), started_at=fleet.start, now=clock())
    observed_jobs_once(app.state.ctx)
    rollup_once(app.state.ctx)
    return fleet, history


def closed_window(
    http: httpx.Client, reader: dict[str, str], start: datetime, end: datetime
) -> dict[str, Any]:
    """The job report of [start, end): each row's figures and faults, and the totals."""
    params = {"start": iso(start), "end": iso(end), "group_by": "job"}
    r = http.get("/api/v1/reports/cost", params=params, headers=reader)
    assert r.status_code == 200, r.text
    data = r.json()
    rows = {
        row["key"]: ({f: round(row[f], 6) for f in FIGURES}, row.get("faults"))
        for row in data["rows"]
    }
    return {"rows": rows, "totals": {f: round(data["totals"][f], 6) for f in FIGURES}}


def test_a_demo_restart_resumes_and_leaves_a_closed_window_as_it_was(
    app: Any, server: str, http: httpx.Client, engine: Engine, clock: FakeClock, tmp_path: Path
) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(prices).values(
                model_pattern="*H100*",
                usd_per_gpu_hour=DEMO_PRICE_USD_PER_GPU_HOUR,
                effective_from=clock() - timedelta(days=1),
            )
        )
    reader = {"Authorization": f"Bearer {make_token(engine, 'reader')}"}
    fleet, first = start_demo(app, server, engine, clock, tmp_path / "first")
    assert not first.resumed and first.backfill_from == fleet.start
    # A window that ended before the stop, with the XID (at 45 min) and the loss inside it.
    window = (fleet.start + timedelta(minutes=10), fleet.start + timedelta(minutes=55))
    before = closed_window(http, reader, *window)
    assert before["totals"]["lost_usd"] > 0
    assert any(faults for _, faults in before["rows"].values())  # the XID job's fault

    clock.advance(20 * 60)  # the demo stopped for 20 minutes, then started again
    again, resumed = start_demo(app, server, engine, clock, tmp_path / "again")
    assert resumed.resumed
    assert again.start == fleet.start  # the scenarios go on where they were
    assert resumed.backfill_from == first.now  # only the gap after the last sample
    assert "resuming the history" in resumed.says("sqlite:///demo.db")

    after = closed_window(http, reader, *window)
    for key in set(before["rows"]) | set(after["rows"]):
        assert before["rows"].get(key) == after["rows"].get(key), key
    assert after == before
