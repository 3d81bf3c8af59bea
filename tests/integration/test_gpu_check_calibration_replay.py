"""The calibration pairs recorded on a real H200 (docs/gpu-check/calibration/) replayed through a
real central service, with each run's job registered and ended at its recorded times; on SQLite
and PostgreSQL.

For each fixable cause the wasteful run's job gets a saving fraction recomputed from its stored
samples equal to the one recorded in ``calib_result.json``, within 10 percentage points of the
real saving the two runs' seconds per step measured; and the fixed run is not promised the fix
it already applied.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.core.diagnosis import Cause
from service.costs.integrals import Thresholds, integrate
from service.costs.recommend import FixAssumptions, cause_fix
from tests.integration.gpu_check_support import _at, _replay
from tests.oracles import point_of
from tests.support import FakeClock

CALIBRATION = Path(__file__).resolve().parents[2] / "docs" / "gpu-check" / "calibration"
TOLERANCE = 0.10
# The words naming each pair's fix (the fixed run applies it).
APPLIED = {
    "input_starved": "DataLoader workers",
    "compute_no_tensor": "autocast",
    "launch_bound": "CUDA graphs",
    "transfer_bound": "pinned",
    "memory_bound": "bf16",
}


def _recorded() -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, Any]]:
    runs = json.loads((CALIBRATION / "calib_runs.json").read_text())
    by_run = {r["run"]: r for r in runs["runs"]}
    result = json.loads((CALIBRATION / "calib_result.json").read_text())
    return runs, by_run, result


def _timed_promise(by_run: dict[str, dict[str, Any]], name: str) -> float:
    """Over the fixed run's timed seconds, decided afresh from the recorded samples: the share
    of the covered time its cause's fix promises to save."""
    run = by_run[f"{name}:after"]
    th = Thresholds()
    points = []
    for line in (CALIBRATION / "calib_agent_output.jsonl").read_text().splitlines():
        batch = json.loads(line)
        listed = bool(batch.get("processes"))
        for s in batch["samples"]:
            points.append(point_of(_at(s["ts"]).timestamp(), s["metrics"], th, has_process=listed))
    points.sort(key=lambda p: p.ts)
    integ = integrate(points, run["timed_from"] + 1.0, run["end"], th)
    model = json.loads((CALIBRATION / "calib_agent_output.jsonl").read_text().splitlines()[0])
    a = FixAssumptions(gpu_model=model["gpus"][0]["model"])
    cause = Cause[name.upper()]
    share = cause_fix(cause, a, integ)[0]
    return float(share * getattr(integ, f"{name}_seconds") / integ.covered_seconds)


@pytest.fixture
def replayed(app: Any, http: httpx.Client, engine: Any, clock: FakeClock) -> dict[str, Any]:
    """GET /jobs/{id} of every recorded run's job, by run, after the replay."""
    runs, by_run, _ = _recorded()
    reader = _replay(
        app, http, engine, clock, CALIBRATION / "calib_agent_output.jsonl", runs["jobs"]
    )
    out = {}
    for run, r in by_run.items():
        got = http.get(f"/api/v1/jobs/{r['job']}", headers=reader)
        assert got.status_code == 200, got.text
        out[run] = got.json()
    return out


def _fix(job: dict[str, Any], cause: str) -> dict[str, Any]:
    fixes: list[dict[str, Any]] = [f for f in job["recommendations"] if f["cause"] == cause]
    (fix,) = fixes
    return fix


def test_each_wasteful_run_is_promised_what_its_fix_really_saved(
    replayed: dict[str, Any],
) -> None:
    _, by_run, result = _recorded()
    assert {p["cause"] for p in result["pairs"]} == set(APPLIED)
    for pair in result["pairs"]:
        name = pair["cause"]
        fix = _fix(replayed[f"{name}:before"], name)
        # Recomputed from the stored samples, as recorded; the tensor-core share was recorded
        # at the datasheet's 989/67 and is now at the speed-up measured by these very runs.
        predicted = pair["predicted_share"]
        if name == "compute_no_tensor":
            predicted *= (1 - 7.42 / 86.70) / (1 - 67 / 989)
        assert fix["saving_fraction"] == pytest.approx(predicted, rel=1e-6), name
        assert "(constant:" not in fix["assumption"], fix
        real = 1.0 - (
            by_run[f"{name}:after"]["seconds_per_step"]
            / by_run[f"{name}:before"]["seconds_per_step"]
        )
        assert abs(fix["saving_fraction"] - real) <= TOLERANCE, (name, fix, real)
        assert fix["saving_usd"] <= fix["usd"] + 1e-12
        # The wasteful run's own fix is its top recommendation.
        top = replayed[f"{name}:before"]["recommendations"][0]
        assert top["cause"] == name, (name, replayed[f"{name}:before"]["recommendations"])


def test_no_fixed_run_is_promised_the_fix_it_already_applied(replayed: dict[str, Any]) -> None:
    _, by_run, _ = _recorded()
    for name, words in APPLIED.items():
        job = replayed[f"{name}:after"]
        # Over its timed seconds (the fix in effect) the applied fix promises nothing material.
        promised = _timed_promise(by_run, name)
        told = [f for f in job["recommendations"] if f["cause"] == name]
        if told and words in told[0]["action"]:
            assert promised <= TOLERANCE, (name, promised, told)
        # Across the whole job (start-up included) it is never the top fix.
        fixes = job["recommendations"]
        assert not fixes or not (fixes[0]["cause"] == name and words in fixes[0]["action"]), (
            name,
            fixes,
        )
    # Copies at the link's peak and tiny kernels already back to back are told the next fix,
    # with no saving promised.
    copies = _fix(replayed["transfer_bound:after"], "transfer_bound")
    assert copies["action"].startswith("move fewer bytes") and copies["saving_usd"] == 0.0
    tiny = _fix(replayed["launch_bound:after"], "launch_bound")
    assert "fuse" in tiny["action"] and "graph" not in tiny["action"]
    assert tiny["saving_usd"] == 0.0
