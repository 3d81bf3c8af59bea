"""The useful-work verdict replayed over the six cause phases the real agent recorded on a real
GPU (docs/gpu-check/causes_*): real work recorded before the agent read /proc is never sham or
hung (its busy windows lack the host side, so they are at most ``unverified``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.core.useful_work import Rules
from service.core.useful_work_replay import phase_shares, recorded_points

CHECK = Path(__file__).resolve().parents[2] / "docs" / "gpu-check"


@pytest.mark.parametrize("hold_seconds", [20.0, 60.0])
@pytest.mark.parametrize("part", ["a", "b", "c"])
def test_the_six_cause_phases_are_never_sham_or_hung(part: str, hold_seconds: float) -> None:
    recorded = recorded_points((CHECK / f"causes_agent_output_{part}.jsonl").read_text())
    phases = json.loads((CHECK / f"causes_result_{part}.json").read_text())["phases"]
    table = phase_shares(recorded, [p | {"want": p["cause"]} for p in phases], Rules(hold_seconds))
    assert table, "no phase replayed"
    for t in table:
        assert t["waste_share"] in (0.0, None), t
