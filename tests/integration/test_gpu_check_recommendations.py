"""The agent output recorded on a real H200 (docs/gpu-check/causes_agent_output_*.jsonl) replayed
through a real central service: each single-cause job's top recommendation is its cause's fix
with a stated saving; the tiny-kernel job is offered a MIG slice, the input-starved loop (once
fed) and the copy-bound jobs none; on SQLite and PostgreSQL."""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.core.diagnosis import WASTE_CAUSES, Cause
from service.costs.integrals import Integrals, Thresholds, integrate
from service.costs.recommend import FixAssumptions, fix_fraction
from service.usecases.upkeep import rollup_once
from tests.conftest import make_token
from tests.oracles import point_of

CHECK = Path(__file__).resolve().parents[2] / "docs" / "gpu-check"
PARTS = ("a", "b")
LEAD, TRAIL = 3.0, 0.5  # as causes_check.py: a sample describes the second before it
NODE = "h200-check"
WASTE = {c.label for c in WASTE_CAUSES}


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


def _batches() -> list[bytes]:
    """The recorded batches, with the workload's process records kept but their job
    attribution left out: the one workload process (``slurm:777``) spans every phase, and as an
    observed job it would share each phase's GPU with the job registered for that phase."""
    out = []
    for part in PARTS:
        for line in (CHECK / f"causes_agent_output_{part}.jsonl").read_text().splitlines():
            batch = json.loads(line)
            for proc in batch.get("processes") or []:
                proc.pop("job_id", None)
                proc.pop("user", None)
            out.append(json.dumps(batch).encode())
    return out


def _phases() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for part in PARTS:
        out += json.loads((CHECK / f"causes_result_{part}.json").read_text())["phases"]
    return out


@pytest.fixture
def replayed(app, http: httpx.Client, engine, clock) -> dict[str, dict[str, Any]]:
    """Every recorded batch posted, a job per phase (and one over the mixed phases) posted,
    rolled up; returns GET /jobs/{id} by phase."""
    batches = _batches()
    phases = _phases()
    last = max(ph["end"] for ph in phases)
    agent = {"Authorization": f"Bearer {make_token(engine, 'agent', NODE)}"}
    reader = {"Authorization": f"Bearer {make_token(engine, 'reader')}"}
    for body in batches:
        # As live: the service's clock a second after the batch's last sample.
        stamps = [s["ts"] for s in json.loads(body)["samples"]]
        clock.set(datetime.fromisoformat(max(stamps).replace("Z", "+00:00")) + timedelta(seconds=1))
        r = http.post(
            "/api/v1/ingest",
            content=gzip.compress(body),
            headers={**agent, "Content-Encoding": "gzip", "Content-Type": "application/json"},
        )
        assert r.status_code == 200, r.text
    clock.set(datetime.fromtimestamp(last + 120, UTC))
    uuid = json.loads(batches[0])["gpus"][0]["uuid"]
    jobs: dict[str, tuple[float, float]] = {}
    for ph in phases:
        if not ph["phase"].startswith("mixed:"):
            jobs[ph["phase"]] = (ph["start"] + LEAD, ph["end"] - TRAIL)
    mixed = [ph for ph in phases if ph["phase"].startswith("mixed:")]
    jobs["mixed"] = (mixed[0]["start"] + LEAD, mixed[-1]["end"] - TRAIL)
    for name, (start, end) in jobs.items():
        job = {"id": f"check:{name}", "gpus": [uuid], "started_at": _utc(start)}
        job["ended_at"] = _utc(end)
        r = http.post("/api/v1/jobs", json=job, headers=agent)
        assert r.status_code == 201, r.text
    rollup_once(app.state.ctx)
    out = {}
    for name in jobs:
        r = http.get(f"/api/v1/jobs/check:{name}", headers=reader)
        assert r.status_code == 200, r.text
        out[name] = r.json()
    return out


H200 = FixAssumptions(gpu_model="NVIDIA H200")


def _integrals(start: float, end: float) -> Integrals:
    """The integrals of the recorded samples over [start, end), decided afresh."""
    points = []
    for body in _batches():
        batch = json.loads(body)
        has_process = bool(batch.get("processes"))
        for sample in batch["samples"]:
            ts = datetime.fromisoformat(sample["ts"].replace("Z", "+00:00")).timestamp()
            points.append(point_of(ts, sample["metrics"], Thresholds(), has_process=has_process))
    return integrate(sorted(points, key=lambda p: p.ts), start, end, Thresholds())


def test_each_single_cause_job_gets_its_fix_first_with_a_stated_saving(
    replayed: dict[str, dict[str, Any]],
) -> None:
    replayed_windows = {ph["phase"]: (ph["start"] + LEAD, ph["end"] - TRAIL) for ph in _phases()}
    for name, job in replayed.items():
        if name == "mixed":
            continue
        fixes = job["recommendations"]
        cost = job["summary"]["cost_usd"]
        assert cost and cost > 0, name  # the shipped default prices price an H200
        if name not in WASTE:  # compute_tensor: healthy, nothing to fix
            assert not [f for f in fixes if f["kind"] == "cause"], (name, fixes)
            continue
        (own,) = [f for f in fixes if f["cause"] == name]
        # The share from the job's own signals, as the pure functions compute it from the
        # recorded samples: the stored integrals carry the same signals.
        want = fix_fraction(Cause[name.upper()], H200, _integrals(*replayed_windows[name]))[0]
        assert own["saving_fraction"] == pytest.approx(want, rel=1e-6, abs=1e-9), (name, own)
        assert 0.0 <= own["saving_fraction"] <= 1.0
        assert job["savings_usd"] <= cost + 1e-9
        if name == "transfer_bound":  # pinned copies both ways at the link's practical peak
            assert own["saving_usd"] == 0.0 and own["action"].startswith("move fewer bytes")
            continue
        top = fixes[0]
        assert top is own, (name, fixes)
        assert top["saving_usd"] > 0 and top["assumption"], top
        assert "(constant:" not in top["assumption"], top
        # At least 90% of the job's seconds are its cause's, so the fix acts on most of it.
        assert top["usd"] >= 0.9 * cost, (name, top, cost)


def test_low_activity_jobs_are_offered_a_mig_slice(replayed: dict[str, dict[str, Any]]) -> None:
    # Tiny kernels fill almost none of the SMs: even launched as graphs they fit one slice.
    tiny = [f for f in replayed["launch_bound"]["recommendations"] if f["kind"] == "mig"]
    assert [f["profile"] for f in tiny] == ["1g.18gb"], replayed["launch_bound"]
    assert "PCIe" in tiny[0]["action"] and "no NVLink" in tiny[0]["action"]
    assert tiny[0]["base"].endswith("the fixes above leave")
    # The input-starved loop (1.8 GiB, SMs busy 11% of the time) would, fed as its fix says,
    # run the same kernels several times as fast: more SM work than a slice holds.
    starved = replayed["input_starved"]["recommendations"]
    assert starved[0]["cause"] == "input_starved" and starved[0]["saving_fraction"] > 0.5
    assert not [f for f in starved if f["kind"] == "mig"], starved
    # Jobs whose copies wait on the GPU's copy engines are never sent to a slice, which has a
    # fraction of them: the pinned-copy job, and the mixed one (a quarter of it copies).
    for name in ("transfer_bound", "mixed"):
        fixes = replayed[name]["recommendations"]
        assert not [f for f in fixes if f["kind"] == "mig"], (name, fixes)
    mixed = replayed["mixed"]
    assert mixed["summary"]["causes"]["transfer_bound"]["seconds"] > 0
    assert mixed["savings_usd"] <= mixed["summary"]["cost_usd"] + 1e-9
    # A job that only held memory is told to release the GPU, not to take a slice.
    held = replayed["idle_held"]["recommendations"]
    assert [f["cause"] for f in held] == ["idle_held"]


def test_energy_of_each_job(replayed: dict[str, dict[str, Any]]) -> None:
    for name, job in replayed.items():
        s, e = job["summary"], job["energy"]
        # The H200 drew 79-700 W; a job of about a minute burns a few watt-hours.
        assert 0.0005 < s["energy_kwh"] < 0.02, (name, s["energy_kwh"])
        assert s["energy_usd"] == pytest.approx(s["energy_kwh"] * 0.12)
        # The counter (read every 6th poll) scaled the power integral by a few percent at most.
        assert e["source"] == "energy_counter", (name, e)
        assert e["kwh"] == pytest.approx(s["energy_kwh"], rel=0.1)
        assert sum(e["by_cause_kwh"].values()) == pytest.approx(e["kwh"], rel=1e-6)
        if name in ("idle_empty", "idle_held"):
            assert e["idle_kwh"] == pytest.approx(e["kwh"], rel=0.01), (name, e)
        elif name != "mixed":
            assert e["by_cause_kwh"][name] >= 0.9 * e["kwh"], (name, e)
    # Idle in memory-holding sleep drew ~121 W, the fp32 GEMM several times more.
    per_second = {
        n: j["energy"]["kwh"] / j["summary"]["allocated_seconds"] for n, j in replayed.items()
    }
    assert per_second["compute_no_tensor"] > 2 * per_second["idle_held"]
