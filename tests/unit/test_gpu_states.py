"""GPU states follow the cause of the latest sample: green ``working`` only for real work."""

from __future__ import annotations

import pytest

from service.core.diagnosis import (
    CAUSES,
    FIXABLE_CAUSES,
    FIXABLE_STATE_SHARE,
    STALE_SECONDS,
    STATE_OF_CAUSE,
    Cause,
    Decision,
    GpuState,
    Rung,
    causes_of_state,
    gpu_state,
)


def test_every_cause_has_one_state_and_the_fixable_ones_a_second() -> None:
    assert set(STATE_OF_CAUSE) == set(CAUSES)
    listed = sorted(c for s in GpuState for c in causes_of_state(s))
    assert listed == sorted([*CAUSES, *FIXABLE_CAUSES])
    assert set(causes_of_state(GpuState.UNDERUSED)) >= FIXABLE_CAUSES


@pytest.mark.parametrize(
    ("cause", "state"),
    [
        (Cause.COMPUTE_TENSOR, GpuState.WORKING),
        # Busy SMs whose fix's share is not known: not green.
        (Cause.MEMORY_BOUND, GpuState.UNDERUSED),
        (Cause.COMPUTE_NO_TENSOR, GpuState.UNDERUSED),
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


@pytest.mark.parametrize("cause", sorted(FIXABLE_CAUSES))
def test_busy_sms_are_working_only_while_their_fix_saves_little(cause: Cause) -> None:
    def state(share: float) -> GpuState:
        return gpu_state(cause=cause, lost=False, age_seconds=5.0, fixable_share=share)

    assert FIXABLE_STATE_SHARE == 0.25
    assert state(0.10) is GpuState.WORKING and state(0.249) is GpuState.WORKING
    assert state(0.25) is GpuState.UNDERUSED and state(0.89) is GpuState.UNDERUSED
    # A share never makes healthy tensor work underused.
    healthy = gpu_state(cause=Cause.COMPUTE_TENSOR, lost=False, age_seconds=5.0, fixable_share=0.9)
    assert healthy is GpuState.WORKING


def test_the_sample_share_follows_the_fix_and_its_setting() -> None:
    """The issue's GPUs: no tensor cores at SM 0.96 (89% waste before) and memory-bound (49%)
    read underused; a site whose fewer-bytes fix saves little sees its memory-bound GPU work."""
    from service.costs.money import sample_waste_share
    from service.costs.recommend import FixAssumptions

    a = FixAssumptions()
    h100 = "NVIDIA H100 80GB HBM3"
    no_tensor = Decision(0.96, Rung.SM_ACTIVE, Cause.COMPUTE_NO_TENSOR)
    a100 = "NVIDIA A100-SXM4-80GB"
    share = sample_waste_share(no_tensor, {"gr_engine_active": 0.997}, a100, a)
    assert share == pytest.approx(0.96 * (1 - 1 / 4))  # conservative: nothing measured on A100
    measured = sample_waste_share(no_tensor, {"gr_engine_active": 0.997}, h100, a)
    assert measured == pytest.approx(0.96 * (1 - 7.32 / 85.49))  # measured on an H100
    h200 = sample_waste_share(no_tensor, {}, "NVIDIA H200", a)
    assert h200 == pytest.approx(0.96 * (1 - 7.42 / 86.70))  # measured on an H200
    memory = Decision(0.99, Rung.SM_ACTIVE, Cause.MEMORY_BOUND)
    half = sample_waste_share(memory, {"dram_active": 0.87}, h100, a)
    assert half == pytest.approx(0.5, abs=0.01)
    assert gpu_state(cause=Cause.MEMORY_BOUND, lost=False, age_seconds=1.0,
                     fixable_share=half) is GpuState.UNDERUSED  # fmt: skip
    small = sample_waste_share(
        memory, {"dram_active": 0.87}, h100, FixAssumptions(memory_speedup=1.2)
    )
    assert small < FIXABLE_STATE_SHARE
    assert gpu_state(cause=Cause.MEMORY_BOUND, lost=False, age_seconds=1.0,
                     fixable_share=small) is GpuState.WORKING  # fmt: skip
