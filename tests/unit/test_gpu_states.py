"""GPU states follow the cause of the latest sample: green ``working`` only for real work."""

from __future__ import annotations

import pytest

from service.core.diagnosis import (
    CAUSES,
    STALE_SECONDS,
    STATE_OF_CAUSE,
    Cause,
    GpuState,
    causes_of_state,
    gpu_state,
)


def test_every_cause_has_one_state() -> None:
    assert set(STATE_OF_CAUSE) == set(CAUSES)
    assert sorted(c for s in GpuState for c in causes_of_state(s)) == sorted(CAUSES)


@pytest.mark.parametrize(
    ("cause", "state"),
    [
        (Cause.COMPUTE_TENSOR, GpuState.WORKING),
        (Cause.MEMORY_BOUND, GpuState.WORKING),
        (Cause.COMPUTE_NO_TENSOR, GpuState.WORKING),
        # Kernels run, but the GPU waits: never shown as working.
        (Cause.LAUNCH_BOUND, GpuState.UNDERUSED),
        (Cause.INPUT_STARVED, GpuState.UNDERUSED),
        (Cause.TRANSFER_BOUND, GpuState.UNDERUSED),
        (Cause.IDLE_HELD, GpuState.IDLE_HELD),
        (Cause.IDLE_EMPTY, GpuState.IDLE),
        (Cause.UNCLASSIFIED, GpuState.UNCLASSIFIED),
    ],
)
def test_a_current_gpu_is_in_its_cause_state(cause: Cause, state: GpuState) -> None:
    assert gpu_state(cause=cause, lost=False, age_seconds=5.0) is state


def test_lost_beats_any_cause_and_old_or_missing_samples_are_no_data() -> None:
    assert gpu_state(cause=Cause.COMPUTE_TENSOR, lost=True, age_seconds=1.0) is GpuState.LOST
    assert gpu_state(cause=None, lost=True, age_seconds=None) is GpuState.LOST
    assert gpu_state(cause=None, lost=False, age_seconds=None) is GpuState.NO_DATA
    assert gpu_state(cause=None, lost=False, age_seconds=1.0) is GpuState.NO_DATA
    old = STALE_SECONDS + 1
    assert gpu_state(cause=Cause.COMPUTE_TENSOR, lost=False, age_seconds=old) is GpuState.NO_DATA
    edge = gpu_state(cause=Cause.COMPUTE_TENSOR, lost=False, age_seconds=STALE_SECONDS)
    assert edge is GpuState.WORKING


def test_states_are_listed_worst_first() -> None:
    order = [s.value for s in GpuState]
    assert order[0] == "lost" and order[-1] == "working"
    assert order.index("idle-held") < order.index("idle") < order.index("underused")
