"""The simulated fleet: deterministic, every scenario recognisable, XID then fall off the bus."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from service.collectors.batch import build_batch
from service.collectors.simulated import SCENARIO_CAUSES, SCENARIOS, SimulatedBackend
from service.wire import IngestBatch

T0 = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)


def run(b: SimulatedBackend, seconds: float, step: float = 10.0):
    out = []
    t = 0.0
    while t <= seconds:
        out.append(b.sample(T0 + timedelta(seconds=t)))
        t += step
    return out


def test_same_seed_same_readings_other_seed_other_readings():
    a = run(SimulatedBackend(start=T0, seed=7, gpus=5), 100)
    b = run(SimulatedBackend(start=T0, seed=7, gpus=5), 100)
    c = run(SimulatedBackend(start=T0, seed=8, gpus=5), 100)
    assert [r.metrics for s in a for r in s.readings] == [r.metrics for s in b for r in s.readings]
    assert [r.metrics for s in a for r in s.readings] != [r.metrics for s in c for r in s.readings]


def test_scenarios_look_like_their_names():
    b = SimulatedBackend(start=T0, gpus=5, xid_after_seconds=10_000)
    snap = b.sample(T0 + timedelta(seconds=30))
    m = {b.scenarios[i]: r.metrics for i, r in enumerate(snap.readings)}
    assert m["training"]["sm_active"] > 0.85 and m["training"]["tensor_active"] > 0.75
    assert m["memory-bound"]["dram_active"] > 0.8 and m["memory-bound"]["tensor_active"] == 0
    assert m["idle-held"]["sm_active"] == 0 and m["idle-held"]["fb_used_bytes"] > 10 * 2**30
    assert m["idle"]["sm_active"] == 0 and m["idle"]["fb_used_bytes"] < 2**30
    jobs = {p.gpu_uuid for p in snap.processes}
    idle_uuid = b.devices()[b.scenarios.index("idle")].uuid
    held_uuid = b.devices()[b.scenarios.index("idle-held")].uuid
    assert held_uuid in jobs and idle_uuid not in jobs


def test_xid_79_is_the_last_reading_then_the_gpu_is_off_the_bus():
    # XID 79 is "GPU has fallen off the bus": the GPU computes no more after it (issue 50).
    b = SimulatedBackend(start=T0, gpus=5, scenarios=list(SCENARIOS[:5]), xid_after_seconds=60)
    snaps = run(b, 200)
    uuid = b.devices()[4].uuid
    xids = [
        (s.ts - T0).total_seconds()
        for s in snaps
        for r in s.readings
        if r.uuid == uuid and "xid_last" in r.metrics
    ]
    assert xids == [60.0]
    last = max((s.ts - T0).total_seconds() for s in snaps for r in s.readings if r.uuid == uuid)
    assert last == 60.0
    assert b.devices()[4].lost and not any(d.lost for d in b.devices()[:4])
    assert len(snaps[-1].readings) == 4


def test_a_fleet_resumed_after_its_xid_has_that_gpu_off_the_bus_from_the_first_poll():
    # A restarted demo resumes its fleet: the GPU that fell off the bus never comes back, nor
    # raises its XID a second time.
    b = SimulatedBackend(start=T0, gpus=5, scenarios=list(SCENARIOS[:5]), xid_after_seconds=60)
    snaps = [b.sample(T0 + timedelta(seconds=t)) for t in (600, 610)]
    uuid = b.devices()[4].uuid
    assert not [r for s in snaps for r in s.readings if r.uuid == uuid]
    assert b.devices()[4].lost and [len(s.readings) for s in snaps] == [4, 4]


def test_batches_from_the_simulator_satisfy_the_wire_contract():
    b = SimulatedBackend(start=T0, gpus=5, xid_after_seconds=0)
    batch = build_batch(
        hostname="sim-0", labels={"rack": "r1"}, devices=b.devices(), snapshots=run(b, 30)
    )
    parsed = IngestBatch.model_validate(batch)
    assert len(parsed.samples) == 17  # 4 polls x 5 GPUs, less the 3 after the XID GPU fell off
    assert parsed.samples[0].metrics.fb_used_bytes is not None  # type: ignore[attr-defined]
    assert any(p.job_id for p in parsed.processes)


def test_unknown_scenario_is_refused():
    with pytest.raises(ValueError, match="unknown scenario"):
        SimulatedBackend(start=T0, scenarios=["sleeping"])


def test_every_scenario_gets_its_cause_and_every_cause_has_a_scenario():
    from service.core.diagnosis import CAUSE_NAMES, USELESS_CAUSES, decide
    from service.costs.integrals import Thresholds

    b = SimulatedBackend(start=T0, gpus=len(SCENARIOS), xid_after_seconds=10_000)
    for t in range(0, 300, 7):
        snap = b.sample(T0 + timedelta(seconds=t))
        held = {p.gpu_uuid for p in snap.processes}
        for i, r in enumerate(snap.readings):
            d = decide(r.metrics, Thresholds(), has_process=r.uuid in held)
            assert d is not None
            assert d.cause.label == SCENARIO_CAUSES[b.scenarios[i]], (b.scenarios[i], t)
    # sham and hung are decided over a window, never from one sample (tests/unit/test_useful_work.py).
    windowed = {c.label for c in USELESS_CAUSES}
    assert set(SCENARIO_CAUSES.values()) == set(CAUSE_NAMES) - {"unclassified"} - windowed
