"""The useful-work verdict replayed over what the real agent recorded on a real GPU (an H100,
docs/gpu-check/useful/): after the hold, at least 95% of each keep-alive loop's and the hung
kernel's GPU-seconds are sham or hung, and at most 1% of the real workloads'; the six cause
phases of docs/gpu-check (recorded without the host side) are never sham or hung either. The
central's own job over the same recording: tests/integration/test_gpu_check_useful_central.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.core.useful_work import Rules
from service.core.useful_work_replay import phase_shares, recorded_points

CHECK = Path(__file__).resolve().parents[2] / "docs" / "gpu-check"
USEFUL = CHECK / "useful"
RESULT = json.loads((USEFUL / "useful_result.json").read_text())
RULES = Rules(hold_seconds=RESULT["hold_seconds"])
TABLE = {
    t["phase"]: t
    for t in phase_shares(
        recorded_points((USEFUL / "useful_agent_output.jsonl").read_text()),
        RESULT["phases"],
        RULES,
    )
}


def test_every_design_and_every_real_workload_was_recorded() -> None:
    assert set(TABLE) == {
        "pid_matmul", "relu_bursts", "spin_sleep", "hung_flag", "starved_training",
        "inference_light", "checkpoint_write", "eval_loop", "notebook_cell",
    }  # fmt: skip
    assert all(t["samples"] >= 0.8 * 15 for t in TABLE.values()), TABLE


@pytest.mark.parametrize("phase", ["pid_matmul", "relu_bursts", "spin_sleep", "hung_flag"])
def test_keep_alive_loops_and_the_hung_kernel_are_sham_or_hung(phase: str) -> None:
    assert TABLE[phase]["waste_share"] >= 0.95, TABLE[phase]


def test_the_hung_kernel_is_called_hung() -> None:
    kinds = TABLE["hung_flag"]["kinds"]
    assert kinds.get("hung", 0) >= 0.95 * TABLE["hung_flag"]["samples"], kinds


@pytest.mark.parametrize(
    "phase",
    ["starved_training", "inference_light", "checkpoint_write", "eval_loop", "notebook_cell"],
)
def test_real_work_is_at_most_one_percent_sham_or_hung(phase: str) -> None:
    assert TABLE[phase]["waste_share"] <= 0.01, TABLE[phase]


def test_the_replay_is_what_the_device_run_reported() -> None:
    assert {t["phase"]: t["waste_share"] for t in RESULT["table"]} == {
        p: t["waste_share"] for p, t in TABLE.items()
    }


@pytest.mark.parametrize("part", ["a", "b", "c"])
def test_the_six_cause_phases_are_never_sham_or_hung(part: str) -> None:
    recorded = recorded_points((CHECK / f"causes_agent_output_{part}.jsonl").read_text())
    phases = json.loads((CHECK / f"causes_result_{part}.json").read_text())["phases"]
    for t in phase_shares(recorded, [p | {"want": p["cause"]} for p in phases], RULES):
        assert t["waste_share"] in (0.0, None), t


@pytest.mark.parametrize("run", ["run1", "run2"])
def test_public_training_scripts_as_they_ship_are_never_sham_or_hung(run: str) -> None:
    """pytorch/examples ImageNet and timm's train.py, recorded by the savings check with the
    agent reading /proc (docs/gpu-check/savings/): every judged second is useful or idle."""
    folder = CHECK / "savings" / run
    runs = json.loads((folder / "savings_runs.json").read_text())["runs"]
    phases = [
        {"phase": f"{r['pair']}:{r['phase']}", "want": "useful", "start": r["job_start"],
         "end": r["job_end"]}
        for r in runs if r["kind"] == "upstream"
    ]  # fmt: skip
    recorded = recorded_points((folder / "savings_agent_output.jsonl").read_text())
    table = phase_shares(recorded, phases, RULES)
    assert len(table) == 4 and all(t["samples"] >= 4 for t in table), table
    assert all(t["waste_share"] == 0.0 for t in table), table


LONG_HOLD = sorted((USEFUL / "hold200").glob("run*"))


@pytest.mark.parametrize("folder", LONG_HOLD, ids=lambda p: p.name)
def test_at_a_200_s_hold_the_loops_stay_sham_and_the_hung_kernel_hung(folder: Path) -> None:
    """The same detector at a hold of 200 s (a third of the default 10 minutes), replayed over
    two longer device runs of the four waste designs (docs/gpu-check/useful/hold200/): a flat
    duty cycle's drift or a burst's jitter over minutes must not break the verdict."""
    result = json.loads((folder / "useful_result.json").read_text())
    rules = Rules(hold_seconds=result["hold_seconds"])
    assert rules.hold_seconds == 200.0
    recorded = recorded_points((folder / "useful_agent_output.jsonl").read_text())
    table = phase_shares(recorded, result["phases"], rules)
    assert [t["waste_share"] for t in table] == [t["waste_share"] for t in result["table"]]
    for t in table:
        assert t["samples"] >= 0.8 * (result["waste_seconds"] - rules.hold_seconds), t
        assert t["kinds"].get(t["want"], 0) >= 0.95 * t["samples"], t


def test_the_long_hold_runs_cover_every_waste_design() -> None:
    phases = {
        ph["phase"]
        for folder in LONG_HOLD
        for ph in json.loads((folder / "useful_result.json").read_text())["phases"]
    }
    assert phases == {"pid_matmul", "relu_bursts", "spin_sleep", "hung_flag"}
