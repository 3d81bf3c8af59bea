"""dcgm-exporter without the framebuffer fields: an idle GPU is idle-held only where a job or a
process holds it, and the fleet says memory was not seen.

The captures are real exporters' output as shipped: their counters leave out every
``DCGM_FI_DEV_FB_*`` field (tests/data/dcgm-exporter names each one's source). The agents read
them through the dcgm-exporter backend, central ingests what they ship, and the shipped
``idle-held-gpu`` policy is evaluated on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import yaml
from sqlalchemy import Engine

from service.usecases.evaluation import evaluate_once
from service.usecases.upkeep import rollup_once
from tests.alerting_support import add_job, auth
from tests.exporter_support import DATA, exporter_agent, ship_at_once
from tests.support import FakeClock

# node -> capture: an L40S node whose pod holds two of its three GPUs, and an H100 in MIG mode
# whose pods hold instances 7 and 9 of 7, 8 and 9.
CAPTURES = {"l40s": "l40s-k8s.prom", "gsrh100-074": "h100-mig-kserve.prom"}
L40S_FREE = "GPU-5bd39b62-f1d2-21f3-d9d5-24cf8d513c73"  # no pod: a batch job holds it here
SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "gpuwarden.yaml"


def idle_held_policy() -> dict[str, Any]:
    """The shipped idle-held-gpu policy, its 30 minutes' wait and its channels left out."""
    (policy,) = [
        p for p in yaml.safe_load(SHIPPED.read_text())["policies"] if p["name"] == "idle-held-gpu"
    ]
    return {k: v for k, v in policy.items() if k not in ("for", "channels")}


def test_without_memory_figures_only_gpus_a_job_holds_are_idle_held(
    app: Any, engine: Engine, clock: FakeClock, http: httpx.Client, tokens: dict[str, str],
    tmp_path: Path,
) -> None:  # fmt: skip
    texts = {node: (DATA / name).read_text() for node, name in CAPTURES.items()}
    assert not any("fb_" in t.lower() for t in texts.values())  # no memory figure at all
    agents = {n: exporter_agent(tmp_path / n, t, n, clock()) for n, t in texts.items()}
    ctx = app.state.ctx
    try:
        ship_at_once(ctx, clock, agents, 1)
        # A batch job (registered as Slurm's prolog does) holds the L40S no pod holds.
        add_job(ctx.engine, "slurm:4242", (L40S_FREE,), started_at=clock())
        ship_at_once(ctx, clock, agents, 10)
    finally:
        for agent in agents.values():
            agent.close()
    rollup_once(ctx)

    reader = auth(tokens["reader"])
    fleet = http.get("/api/v1/fleet", headers=reader).json()
    gpus = {g["uuid"]: g for g in fleet["gpus"]}
    assert len(gpus) == 6 and all(g["memory_unknown"] for g in gpus.values())
    held = {u for u, g in gpus.items() if g["job"] is not None}
    assert len(held) == 5
    for uuid, g in gpus.items():
        assert (g["state"], g["cause"]) == (
            ("idle-held", "idle_held") if uuid in held else ("idle", "idle_empty")
        ), g
    (free,) = set(gpus) - held
    assert free.startswith("MIG-GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77/8/")
    assert gpus[L40S_FREE]["job"] == "slurm:4242"
    assert fleet["state_counts"]["idle-held"] == 5 and fleet["state_counts"]["idle"] == 1
    metrics = http.get("/metrics").text
    assert "\ngpuwarden_fleet_gpus_idle_held 5.0\n" in metrics

    admin = auth(tokens["admin"])
    r = http.post("/api/v1/policies", json=idle_held_policy(), headers=admin)
    assert r.status_code == 201, r.text
    evaluate_once(ctx)
    alerts = http.get("/api/v1/alerts", headers=admin).json()
    firing = {a["labels"]["gpu_uuid"] for a in alerts if a["state"] == "firing"}
    assert firing == held  # none on the instance no job holds
