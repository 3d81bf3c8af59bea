"""The real H200 capture of three jobs on one GPU (docs/gpu-check/shared/), replayed through
the tenant split: the idle notebook is idle_held, the busy loop gets the GPU's cause, and the
tenants' seconds, activity and dollars add up to the GPU's under every rule."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from service.costs.integrals import Thresholds, integrate
from service.costs.tenants import SplitRule, TenantProcess, split_stretch
from tests.oracles import point_of, split_cents

CAPTURE = Path(__file__).parents[2] / "docs/gpu-check/shared/tenants_samples.jsonl"
BUSY, STARVED, IDLE = "slurm:9101", "slurm:9102", "slurm:9103"
USD_PER_GPU_HOUR = 3.72


def _load() -> tuple[list[Any], dict[float, list[TenantProcess]], float, float]:
    lines = [json.loads(x) for x in CAPTURE.read_text().splitlines()]
    recs = lines[1:]
    t = Thresholds()
    points, procs = [], {}
    for r in recs:
        ts = datetime.fromisoformat(r["ts"]).timestamp()
        points.append(point_of(ts, r["reading"][0]["metrics"], t, has_process=True))
        sm = {row["pid"]: row["sm"] / 100.0 for row in r["proc_util"]["rows"]}
        procs[ts] = [
            TenantProcess(f"slurm:{row['job']}", float(row["used_bytes"]), sm.get(row["pid"], 0.0))
            for row in r["running"]["rows"]
        ]
    return points, procs, points[0].ts, points[-1].ts + 1.0


def test_capture_is_what_the_readme_says() -> None:
    points, procs, start, end = _load()
    assert len(points) >= 100 and end - start >= 100
    jobs = {p.job_id for listed in procs.values() for p in listed}
    assert jobs == {BUSY, STARVED, IDLE}
    # NVML left the idle process out of its per-process samples (at most a stray first one).
    idle_busy = [p for listed in procs.values() for p in listed if p.job_id == IDLE and p.sm_util]
    assert len(idle_busy) <= 2


@pytest.mark.parametrize("rule", list(SplitRule))
def test_real_capture_split(rule: SplitRule) -> None:
    points, procs, start, end = _load()
    t = Thresholds()
    holding = {job: [(start, end)] for job in (BUSY, STARVED, IDLE)}
    out = split_stretch(points, procs, holding, start, end, t, rule)
    gpu = integrate(points, start, end, t)
    assert gpu.compute_tensor_seconds / gpu.covered_seconds > 0.9  # the GPU itself looked busy
    shares = {k: v.integrals for k, v in out.items()}
    assert set(shares) == {BUSY, STARVED, IDLE}
    covered = sum(s.covered_seconds for s in shares.values())
    assert covered == pytest.approx(gpu.covered_seconds)
    active = sum(s.covered_seconds - s.unused_seconds for s in shares.values())
    assert active == pytest.approx(gpu.covered_seconds - gpu.unused_seconds)
    idle = shares[IDLE]
    assert idle.compute_tensor_seconds <= 0.02 * gpu.covered_seconds
    if rule is SplitRule.ACTIVITY:
        assert idle.covered_seconds <= 0.02 * gpu.covered_seconds  # it ran nothing: pays ~0
    else:
        assert idle.idle_held_seconds >= 0.98 * idle.covered_seconds > 0
    busy = shares[BUSY]
    assert busy.compute_tensor_seconds == pytest.approx(busy.covered_seconds)
    if rule is SplitRule.MEMORY:  # the notebook holds 8.6 GiB of the 10.8 GiB: most of the cost
        assert idle.covered_seconds > busy.covered_seconds + shares[STARVED].covered_seconds
    # Dollars: the GPU's cost in cents split by the tenants' covered seconds adds up exactly.
    gpu_cents = round(USD_PER_GPU_HOUR * gpu.covered_seconds / 36)
    cents = split_cents(gpu_cents, {k: s.covered_seconds for k, s in shares.items()})
    assert sum(cents.values()) == gpu_cents
    for k, s in shares.items():
        assert abs(cents[k] - USD_PER_GPU_HOUR * s.covered_seconds / 36) < 1.0
