"""The batches the real agent shipped on a real H200 (docs/gpu-check/advice_check.py and
docs/gpu-check/shared/tenants_check.py) replayed through a real central service, with the jobs
registered as the Slurm prolog registered them there; on SQLite and PostgreSQL.

One job per workload: each single-cause job's top fix is its cause's, with a saving stated and
never more than the job cost (the pinned copies at the link's peak are told to move fewer bytes,
with no saving promised), and the job holding a fifth of the H200 at low activity is offered
a MIG slice. Three jobs on one GPU: under every split rule the jobs' dollars add up to the GPU's
to the cent, the bf16 loop takes the GPU's compute_tensor time, and the notebook that ran
nothing is idle_held (equal and memory) or pays almost nothing (activity).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.core.diagnosis import WASTE_CAUSES, Cause
from service.costs.tenants import SplitRule
from service.settings import Settings
from tests.integration.gpu_check_support import _replay
from tests.support import FakeClock

CHECK = Path(__file__).resolve().parents[2] / "docs" / "gpu-check"
# One workload per cause of waste: its job's top fix must be that cause's.
# The per-sample waste causes the advice check ran a phase of (sham and hung are decided over a
# window of samples; their own check is docs/gpu-check/useful/).
SINGLE_CAUSE = tuple(c.label for c in WASTE_CAUSES if c not in (Cause.SHAM, Cause.HUNG))


def _replay_advice(
    app: Any, http: httpx.Client, engine: Any, clock: FakeClock
) -> tuple[dict[str, str], dict[str, str]]:
    """The advice check's recorded agent output replayed: (job id by phase, reader headers)."""
    result = json.loads((CHECK / "advice_result.json").read_text())
    by_phase = {ph["phase"]: ph["job"] for ph in result["phases"]}
    recorded = {ph["job"]: result["jobs"][ph["phase"]] for ph in result["phases"]}
    reader = _replay(app, http, engine, clock, CHECK / "advice_agent_output.jsonl", recorded)
    return by_phase, reader


def test_each_live_job_gets_its_fix_and_the_mig_sized_job_a_slice(
    app: Any, http: httpx.Client, engine: Any, clock: FakeClock
) -> None:
    by_phase, reader = _replay_advice(app, http, engine, clock)
    jobs = {}
    for phase, job_id in by_phase.items():
        r = http.get(f"/api/v1/jobs/{job_id}", headers=reader)
        assert r.status_code == 200, r.text
        jobs[phase] = r.json()
    # The pinned copies both ways ran at the link's practical peak: their fix is fewer bytes,
    # with no saving promised (pinning what is pinned saves nothing).
    (copies,) = [
        f for f in jobs["transfer_bound"]["recommendations"] if f["cause"] == "transfer_bound"
    ]
    assert copies["cause"] == "transfer_bound" and copies["saving_usd"] == 0.0, copies
    assert copies["action"].startswith("move fewer bytes"), copies
    assert "pinned" not in copies["action"] and "limit" in copies["assumption"], copies
    for phase in (p for p in SINGLE_CAUSE if p != "transfer_bound"):
        job = jobs[phase]
        cost = job["summary"]["cost_usd"]
        top = job["recommendations"][0]
        assert (top["kind"], top["cause"]) == ("cause", phase), (phase, job["recommendations"])
        assert top["saving_usd"] > 0 and top["assumption"], top
        # The workload's own cause holds most of the job; the first seconds, before its
        # process had a CUDA context, were the job holding an empty GPU.
        assert top["usd"] >= 0.8 * cost, (phase, top, cost)
        assert job["savings_usd"] <= cost + 1e-9
    healthy = jobs["compute_tensor"]
    assert healthy["summary"]["causes"]["compute_tensor"]["seconds"] >= (
        0.8 * healthy["summary"]["allocated_seconds"]
    )
    assert not [f for f in healthy["recommendations"] if f.get("cause") == "compute_tensor"]
    # The tiny kernels fit a slice even launched as graphs; the job holding a fifth of the
    # memory at a fifth of the SMs does not once fed as its fix says (several times the work
    # per second), nor does the input-starved loop.
    mig = [f for f in jobs["launch_bound"]["recommendations"] if f["kind"] == "mig"]
    assert [f["profile"] for f in mig] == ["1g.18gb"], jobs["launch_bound"]["recommendations"]
    assert mig[0]["saving_usd"] > 0
    for phase in ("mig_fit", "input_starved"):
        fixes = jobs[phase]["recommendations"]
        assert not [f for f in fixes if f["kind"] == "mig"], (phase, fixes)
        assert jobs[phase]["savings_usd"] <= jobs[phase]["summary"]["cost_usd"] + 1e-9
    # The jobs that filled the GPU (memory-bound, fp32 and bf16 GEMMs) are not sent to a slice,
    # nor the pinned copies, which a slice's fraction of the copy engines would slow.
    for phase in ("memory_bound", "compute_no_tensor", "compute_tensor", "transfer_bound"):
        assert not [f for f in jobs[phase]["recommendations"] if f["kind"] == "mig"], phase


@pytest.mark.parametrize("rule", list(SplitRule))
def test_three_live_tenants_reconcile_under_every_rule(
    app: Any, http: httpx.Client, engine: Any, clock: FakeClock, settings: Settings,
    rule: SplitRule,
) -> None:  # fmt: skip
    settings.cost_split_rule = rule.value
    result = json.loads((CHECK / "shared" / "tenants_result.json").read_text())
    reader = _replay(
        app, http, engine, clock, CHECK / "shared" / "tenants_agent_output.jsonl", result["jobs"]
    )
    t0, t1 = result["window"]
    params = {
        "start": datetime.fromtimestamp(t0 - 10, clock().tzinfo).isoformat(),
        "end": datetime.fromtimestamp(t1 + 10, clock().tzinfo).isoformat(),
    }
    by_job = http.get(
        "/api/v1/reports/cost", params={**params, "group_by": "job"}, headers=reader
    ).json()
    by_gpu = http.get(
        "/api/v1/reports/cost", params={**params, "group_by": "gpu"}, headers=reader
    ).json()
    assert by_job["split_rule"] == rule.value
    rows = {r["key"]: r for r in by_job["rows"]}
    gpu_cost = by_gpu["totals"]["cost_usd"]
    assert round(sum(r["cost_usd"] for r in rows.values()), 2) == round(gpu_cost, 2)
    assert abs(sum(r["cost_usd"] for r in rows.values()) - gpu_cost) < 1e-6
    busy, starved, notebook = rows["slurm:9101"], rows["slurm:9102"], rows["slurm:9103"]
    # Its first seconds, before the processes had CUDA contexts, the GPU held nothing.
    running = busy["allocated_seconds"] - busy["causes"]["idle_empty"]["seconds"]
    assert busy["causes"]["compute_tensor"]["seconds"] >= 0.9 * running > 0
    assert starved["causes"]["compute_tensor"]["seconds"] > 0
    if rule is SplitRule.ACTIVITY:
        assert notebook["cost_usd"] <= 0.03 * gpu_cost
        assert busy["cost_usd"] > starved["cost_usd"] > notebook["cost_usd"]
    else:
        # Before the three processes had CUDA contexts the GPU held nothing (idle_empty);
        # from then on the notebook never ran a kernel.
        held = notebook["causes"]["idle_held"]["seconds"]
        empty = notebook["causes"]["idle_empty"]["seconds"]
        assert held + empty >= 0.97 * notebook["allocated_seconds"]
        assert held >= 0.85 * notebook["allocated_seconds"]
        if rule is SplitRule.MEMORY:  # 22 GiB against about 1 GiB each
            assert notebook["cost_usd"] > busy["cost_usd"] + starved["cost_usd"]


def test_each_live_jobs_waste_is_its_fixes_savings_and_the_bf16_job_wastes_its_start_only(
    app: Any, http: httpx.Client, engine: Any, clock: FakeClock
) -> None:
    by_phase, reader = _replay_advice(app, http, engine, clock)
    jobs = {
        phase: http.get(f"/api/v1/jobs/{job_id}", headers=reader).json()
        for phase, job_id in by_phase.items()
    }
    for phase in SINGLE_CAUSE:
        s = jobs[phase]["summary"]
        # A MIG slice prices the time the other fixes leave: beyond the waste.
        fixes = [f for f in jobs[phase]["recommendations"] if f["kind"] != "mig"]
        own = next(f for f in fixes if f["cause"] == phase)
        rest = [f for f in fixes if f is not own]
        # The waste is the workload's own fix's saving and, besides it, only the few seconds
        # before its process had a CUDA context (the job holding an empty GPU) or between its
        # kernels' phases.
        assert round(sum(f["saving_usd"] for f in fixes), 2) == round(s["waste_usd"], 2), (
            phase, s["waste_usd"], fixes,
        )  # fmt: skip
        assert own["saving_usd"] == pytest.approx(s["causes"][phase]["waste_usd"])
        assert sum(f["seconds"] for f in rest) <= 0.2 * s["allocated_seconds"], (phase, rest)
        if own["saving_usd"] > 0:  # copies at the link's limit: no saving promised
            assert s["top_cause"] == phase and fixes[0] is own, (phase, fixes)
        assert s["waste_usd"] <= s["cost_usd"] + 1e-9
    # The bf16 loop: its tensor-core time is no waste; what it wastes is its start-up, the
    # seconds before the loop ran (4 s with an empty GPU, a second of its first kernels).
    healthy = jobs["compute_tensor"]["summary"]
    causes = healthy["causes"]
    per_second = causes["compute_tensor"]["usd"] / causes["compute_tensor"]["seconds"]
    assert causes["compute_tensor"]["waste_usd"] == 0
    start_up = healthy["allocated_seconds"] - causes["compute_tensor"]["seconds"]
    idle_seconds = causes["idle_empty"]["seconds"] + causes["idle_held"]["seconds"]
    assert 0 < idle_seconds <= start_up <= 0.2 * healthy["allocated_seconds"]
    assert healthy["idle_usd"] == pytest.approx(idle_seconds * per_second, rel=0.01)
    assert idle_seconds * per_second <= healthy["waste_usd"] <= start_up * per_second + 1e-9
