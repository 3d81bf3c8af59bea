"""The health fields and clocks' reasons as a real H100 answered them (docs/gpu-check/
health_check.py, recorded in health_fields.json), replayed through the NVML backend."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from service.collectors.nvml import NvmlBackend
from service.collectors.nvml_fields import HEALTH_FIELDS
from service.vocabulary import clock_event_names, hw_slowdown
from tests.fake_nvml import FakeGpu, FakeNvml

RECORDED = Path(__file__).resolve().parents[2] / "docs" / "gpu-check" / "health_fields.json"
T0 = datetime(2026, 12, 7, tzinfo=UTC)


def recorded() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(RECORDED.read_text())
    return data


def test_the_backend_reads_what_nvml_answered_and_leaves_out_what_it_did_not() -> None:
    (gpu,) = recorded()["nvml"]
    answered = {f["field_id"]: f["value"] for f in gpu["fields"] if f["nvml_return"] == 0}
    assert answered == {4: 0}  # double-bit ECC only: no retired pages, no NVLink counters
    fake = FakeGpu(gpu["uuid"], fields=answered, clocks_event_reasons=gpu["clocks_event_reasons"])
    b = NvmlBackend(lib=FakeNvml([fake]), energy_every_cycles=1)
    (r,) = b.sample(T0).readings
    want = {HEALTH_FIELDS[i]: v for i, v in answered.items()}
    assert {k: r.metrics[k] for k in HEALTH_FIELDS.values() if k in r.metrics} == want
    assert r.metrics["clocks_event_reasons"] == gpu["clocks_event_reasons"]


def test_the_recorded_reasons_read_as_no_hardware_slowdown_in_any_phase() -> None:
    readings = recorded()["readings"]
    by_phase: dict[str, set[str]] = {}
    for r in readings:
        reasons = r["metrics"]["clocks_event_reasons"]
        by_phase.setdefault(r["phase"], set()).update(clock_event_names(reasons))
        # A healthy GPU at 700 W is held by its software power cap, never by the hardware.
        assert not hw_slowdown(reasons), r
    assert by_phase["idle"] == {"gpu_idle"}
    load = [r for r in readings if r["phase"] == "load" and (r["sm_active"] or 0) > 0.9]
    assert len(load) >= 10
    assert all(clock_event_names(r["metrics"]["clocks_event_reasons"]) == ["sw_power_cap"]
               for r in load)  # fmt: skip


def test_replayed_clocks_answers_come_back_unchanged() -> None:
    readings = recorded()["readings"]
    fake = FakeGpu("GPU-replay")
    b = NvmlBackend(lib=FakeNvml([fake]), energy_every_cycles=1)
    for k, r in enumerate(readings):
        fake.clocks_event_reasons = r["metrics"]["clocks_event_reasons"]
        (got,) = b.sample(T0 + timedelta(seconds=k)).readings
        assert got.metrics["clocks_event_reasons"] == r["metrics"]["clocks_event_reasons"]
