"""Split rules of a shared GPU, table-driven: shares, causes, and sums that reconcile."""

from __future__ import annotations

import pytest

from service.core.diagnosis import Cause, Rung
from service.costs.integrals import ActivityPoint, Thresholds, integrate
from service.costs.tenants import (
    UNALLOCATED_TENANT,
    SplitRule,
    TenantProcess,
    TenantState,
    busy_shares,
    split_stretch,
    tenant_cause,
    tenant_states,
    time_shares,
)
from tests.oracles import split_cents

GIB = 1024**3
BUSY = TenantState(fb_used_bytes=2 * GIB, sm_util=0.9, has_process=True)
STARVED = TenantState(fb_used_bytes=2 * GIB, sm_util=0.1, has_process=True)
IDLE = TenantState(fb_used_bytes=8 * GIB, sm_util=0.0, has_process=True)
EMPTY = TenantState()
NO_PER_PROCESS = TenantState(fb_used_bytes=4 * GIB, sm_util=None, has_process=True)
MAYBE = TenantState(fb_used_bytes=2 * GIB, sm_util=None, has_process=None)  # not known empty


@pytest.mark.parametrize(
    ("rule", "states", "busy", "expected"),
    [
        (SplitRule.EQUAL, {"a": BUSY, "b": IDLE}, True, {"a": 0.5, "b": 0.5}),
        (
            SplitRule.EQUAL,
            {"a": BUSY, "b": IDLE, "c": EMPTY},
            True,
            {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3},
        ),
        (SplitRule.MEMORY, {"a": BUSY, "b": IDLE}, True, {"a": 0.2, "b": 0.8}),
        (
            SplitRule.MEMORY,
            {"a": BUSY, "b": IDLE, "c": EMPTY},
            False,
            {"a": 0.2, "b": 0.8, "c": 0.0},
        ),
        (SplitRule.MEMORY, {"a": EMPTY, "b": EMPTY}, False, {"a": 0.5, "b": 0.5}),  # nobody holds
        (
            SplitRule.ACTIVITY,
            {"a": BUSY, "b": STARVED, "c": IDLE},
            True,
            {"a": 0.9, "b": 0.1, "c": 0.0},
        ),
        (SplitRule.ACTIVITY, {"a": BUSY, "b": IDLE}, False, {"a": 0.2, "b": 0.8}),  # idle: memory
        (SplitRule.ACTIVITY, {"a": NO_PER_PROCESS, "b": IDLE}, True, {"a": 1 / 3, "b": 2 / 3}),
    ],
)
def test_time_shares(
    rule: SplitRule, states: dict[str, TenantState], busy: bool, expected: dict[str, float]
) -> None:
    got = time_shares(rule, states, busy=busy)
    assert got == pytest.approx(expected)
    assert sum(got.values()) == pytest.approx(1.0)


def test_busy_shares_leave_out_unknown_and_zero() -> None:
    assert busy_shares({"a": NO_PER_PROCESS, "b": NO_PER_PROCESS}) is None
    assert busy_shares({"a": IDLE, "b": EMPTY}) is None  # nobody ran kernels: does not tell
    assert busy_shares({"a": STARVED, "b": EMPTY}) == {"a": 1.0, "b": 0.0}


@pytest.mark.parametrize(
    ("gpu", "state", "share", "expected"),
    [
        (Cause.COMPUTE_TENSOR, BUSY, 0.9, Cause.COMPUTE_TENSOR),
        (Cause.COMPUTE_TENSOR, IDLE, 0.0, Cause.IDLE_HELD),  # no kernels while the other is busy
        (Cause.COMPUTE_TENSOR, EMPTY, 0.0, Cause.IDLE_EMPTY),  # allocated, nothing running
        (Cause.COMPUTE_TENSOR, NO_PER_PROCESS, None, Cause.COMPUTE_TENSOR),  # cannot tell
        (Cause.COMPUTE_TENSOR, EMPTY, None, Cause.IDLE_EMPTY),
        (Cause.IDLE_HELD, BUSY, None, Cause.IDLE_HELD),
        (Cause.IDLE_HELD, EMPTY, None, Cause.IDLE_EMPTY),
        (Cause.INPUT_STARVED, STARVED, 0.1, Cause.INPUT_STARVED),
        (Cause.COMPUTE_TENSOR, MAYBE, None, Cause.COMPUTE_TENSOR),  # may run the GPU's kernels
        (Cause.COMPUTE_TENSOR, MAYBE, 0.0, Cause.IDLE_HELD),  # its own figure: none; held, maybe
        (Cause.IDLE_HELD, MAYBE, None, Cause.IDLE_HELD),
        (Cause.IDLE_EMPTY, MAYBE, None, Cause.IDLE_EMPTY),
    ],
)
def test_tenant_cause(gpu: Cause, state: TenantState, share: float | None, expected: Cause) -> None:
    assert tenant_cause(gpu, state, share) is expected


def test_a_process_nobody_could_attribute_is_every_holders_in_equal_parts() -> None:
    """Pods time-slicing a GPU, the agent unable to tell whose process is whose: each pod gets
    an equal part of it and none is called empty."""
    procs = [
        TenantProcess(None, 6 * GIB, 0.4),
        TenantProcess("pod-a", None, None, is_process=False),  # holder rows
        TenantProcess("pod-b", None, None, is_process=False),
    ]
    states = tenant_states(["pod-a", "pod-b"], procs)
    assert states == {
        "pod-a": TenantState(3 * GIB, 0.2, None),
        "pod-b": TenantState(3 * GIB, 0.2, None),
    }
    for rule in SplitRule:
        assert time_shares(rule, states, busy=True) == pytest.approx({"pod-a": 0.5, "pod-b": 0.5})
    # One process known: the other pod has none of its own, but may run the unknown one.
    known = [TenantProcess("pod-a", 2 * GIB, 0.3), TenantProcess(None, 2 * GIB, None)]
    states = tenant_states(["pod-a", "pod-b"], known)
    assert states["pod-a"] == TenantState(3 * GIB, 0.3, True)
    assert states["pod-b"] == TenantState(1 * GIB, None, None)
    # Every process known: a pod without one is empty.
    assert tenant_states(["pod-a", "pod-b"], known[:1])["pod-b"] == TenantState(0.0, None, False)
    # Nothing listed although the GPU holds or runs something (dcgm-exporter lists no process).
    assert tenant_states(["pod-a"], procs[1:2], unseen=True)["pod-a"].has_process is None


def _point(ts: float, activity: float, cause: Cause) -> ActivityPoint:
    return ActivityPoint(ts, activity, int(Rung.SM_ACTIVE), int(cause), 400.0)


@pytest.mark.parametrize("rule", list(SplitRule))
def test_stretch_adds_up_to_the_gpu(rule: SplitRule) -> None:
    """Three jobs, one leaving mid-minute, a gap and an unheld tail: every figure adds up."""
    t = Thresholds(max_gap_seconds=5.0)
    points = [_point(float(s), 0.9 if s < 40 else 0.0, Cause.COMPUTE_TENSOR if s < 40 else Cause.IDLE_HELD)
              for s in range(0, 60) if not 20 <= s < 30]  # fmt: skip
    procs = {
        float(s): [
            TenantProcess("a", 2 * GIB, 0.6 if s < 40 else 0.0),
            TenantProcess("b", 2 * GIB, 0.3 if s < 40 else 0.0),
            TenantProcess("c", 8 * GIB, None),
        ]
        for s in range(60)
    }
    holding = {"a": [(0.0, 55.0)], "b": [(0.0, 55.0)], "c": [(0.0, 35.0)]}
    out = split_stretch(points, procs, holding, 0.0, 60.0, t, rule)
    gpu = integrate(points, 0.0, 60.0, t)
    for field in ("covered_seconds", "unused_seconds", "energy_used_joules", "idle_seconds"):
        total = sum(getattr(s.integrals, field) for s in out.values())
        if field == "idle_seconds":
            continue  # tenants idle while the GPU is busy: more idle than the GPU, on purpose
        assert total == pytest.approx(getattr(gpu, field)), field
    assert sum(s.held_seconds for s in out.values()) == pytest.approx(60.0)
    assert out[UNALLOCATED_TENANT].integrals.covered_seconds == pytest.approx(5.0)
    c = out["c"].integrals
    assert c.compute_tensor_seconds == 0.0  # c listed no per-process samples but others did
    if rule is SplitRule.ACTIVITY:
        assert c.covered_seconds == 0.0  # busy time by SM share: c had none; c left before idle
    else:
        assert c.covered_seconds > 0
        assert c.idle_held_seconds == pytest.approx(c.covered_seconds)
    a, b = out["a"].integrals, out["b"].integrals
    assert a.compute_tensor_seconds > 0 and b.compute_tensor_seconds > 0
    if rule is SplitRule.ACTIVITY:
        # a ran twice b's SM share: twice the busy seconds and twice the activity
        assert a.compute_tensor_seconds == pytest.approx(2 * b.compute_tensor_seconds)


@pytest.mark.parametrize("rule", list(SplitRule))
def test_a_minute_of_a_long_series_is_split_as_from_its_own_samples(rule: SplitRule) -> None:
    """A caller passes a GPU's whole series for each shared minute: the minute's shares are
    those its own samples give (the one before it included), whatever lies further away."""
    t = Thresholds(max_gap_seconds=25.0)
    # Samples every 7 s with two gaps (longer than max_gap, and shorter), over ten minutes.
    stamps = [float(s) for s in range(0, 600, 7) if not (130 <= s < 190 or 300 <= s < 320)]
    points = [_point(s, (s % 11) / 10, Cause.COMPUTE_TENSOR if s % 3 else Cause.IDLE_HELD)
              for s in stamps]  # fmt: skip
    procs = {
        s: [TenantProcess("a", 2 * GIB, 0.5), TenantProcess("b", 6 * GIB, 0.2)] for s in stamps
    }
    holding = {"a": [(0.0, 600.0)], "b": [(45.0, 400.0)]}
    for minute in range(10):
        lo, hi = 60.0 * minute, 60.0 * minute + 60.0
        before = [p for p in points if p.ts < lo][-1:]
        own = (
            before + [p for p in points if lo <= p.ts < hi] + [p for p in points if p.ts >= hi][:1]
        )
        whole = split_stretch(points, procs, holding, lo, hi, t, rule)
        assert whole == split_stretch(own, procs, holding, lo, hi, t, rule), minute
        assert sum(s.held_seconds for s in whole.values()) == pytest.approx(60.0), minute
        covered = integrate(points, lo, hi, t).covered_seconds
        assert sum(s.integrals.covered_seconds for s in whole.values()) == pytest.approx(covered)


@pytest.mark.parametrize(
    ("cents", "weights", "expected"),
    [
        (100, {"a": 1, "b": 1, "c": 1}, {"a": 34, "b": 33, "c": 33}),
        (1, {"a": 1, "b": 1}, {"a": 1, "b": 0}),
        (1000, {"a": 0.2, "b": 0.8}, {"a": 200, "b": 800}),
        (7, {"a": 0.0, "b": 0.0}, {"a": 4, "b": 3}),
        (0, {"a": 1.0}, {"a": 0}),
    ],
)
def test_split_cents_adds_up(
    cents: int, weights: dict[str, float], expected: dict[str, int]
) -> None:
    got = split_cents(cents, weights)
    assert got == expected
    assert sum(got.values()) == cents
