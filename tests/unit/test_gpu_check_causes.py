"""The causes of the samples the agent recorded on a real H200 (docs/gpu-check/causes_*):
leaving out the samples at phase boundaries, at least 90% of each phase's covered seconds
land in the cause its workload exercises, under the default thresholds."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from service.core.diagnosis import CAUSE_NAMES, USELESS_CAUSES
from service.costs.integrals import ActivityPoint, Thresholds, integrate
from tests.oracles import point_of

CHECK = Path(__file__).resolve().parents[2] / "docs" / "gpu-check"
PARTS = sorted(p.name.removeprefix("causes_result_").removesuffix(".json")
               for p in CHECK.glob("causes_result_*.json"))  # fmt: skip
LEAD, TRAIL = 3.0, 0.5  # as causes_check.py: a sample describes the second before it


def recorded(part: str) -> tuple[list[ActivityPoint], list[dict[str, Any]]]:
    th = Thresholds()
    points = []
    for line in (CHECK / f"causes_agent_output_{part}.jsonl").read_text().splitlines():
        batch = json.loads(line)
        listed = {(p["gpu_uuid"], p["ts"]) for p in batch["processes"]}
        for s in batch["samples"]:
            ts = datetime.fromisoformat(s["ts"].replace("Z", "+00:00")).timestamp()
            has_process = (s["gpu_uuid"], s["ts"]) in listed
            points.append(point_of(ts, s["metrics"], th, has_process=has_process))
    points.sort(key=lambda p: p.ts)
    phases = json.loads((CHECK / f"causes_result_{part}.json").read_text())["phases"]
    return points, phases


def test_the_recording_covers_every_cause() -> None:
    seen = {ph["cause"] for part in PARTS for ph in recorded(part)[1]}
    # sham and hung are decided over a window (docs/gpu-check/useful/, test_useful_work_cause_phases.py).
    assert seen == set(CAUSE_NAMES) - {"unclassified"} - {c.label for c in USELESS_CAUSES}


@pytest.mark.parametrize("part", PARTS)
def test_each_phase_lands_in_its_cause(part: str) -> None:
    points, phases = recorded(part)
    assert phases
    for ph in phases:
        lo, hi = ph["start"] + LEAD, ph["end"] - TRAIL
        inside = [p for p in points if lo <= p.ts <= hi]
        got = integrate(inside, lo, hi, Thresholds())
        assert got.covered_seconds >= 0.8 * (hi - lo - 1), ph["phase"]
        share = got.cause_seconds()[ph["cause"]] / got.covered_seconds
        assert share >= 0.9, (ph["phase"], got.cause_seconds())
