"""The activity ladder and the cause of a sample, table-driven at every threshold edge."""

from __future__ import annotations

from typing import Any

import pytest

from service.core.diagnosis import (
    CAUSE_NAMES,
    IDLE_CAUSES,
    Cause,
    Rung,
    Thresholds,
    activity,
    decide,
    memory_unknown,
    supported_causes,
)

T = Thresholds()
GIB = 1024**3
EPS = 1e-9

# A GPM sample of each kind, with the figures a real H200 showed for it (docs/gpu-check/).
TINY_KERNELS = {"sm_active": 0.03, "gpu_util": 0.33, "dram_active": 0.0, "tensor_active": 0.0}
STARVED = {"sm_active": 0.03, "gpu_util": 0.045, "dram_active": 0.01, "tensor_active": 0.0}
COPIES = {
    "sm_active": 0.0, "gpu_util": 0.99, "pcie_tx_bytes_per_second": 29e9,
    "pcie_rx_bytes_per_second": 29e9, "tensor_active": 0.0, "dram_active": 0.05,
}  # fmt: skip
ELEMENTWISE = {"sm_active": 0.99, "gpu_util": 1.0, "dram_active": 0.87, "tensor_active": 0.0}
SGEMM = {"sm_active": 0.96, "gpu_util": 1.0, "dram_active": 0.1, "tensor_active": 0.0}
BF16 = {"sm_active": 0.95, "gpu_util": 1.0, "dram_active": 0.16, "tensor_active": 0.92}
HELD = {"sm_active": 0.0, "gpu_util": 0.0, "fb_used_bytes": 22 * GIB, "tensor_active": 0.0}
EMPTY = {"sm_active": 0.0, "gpu_util": 0.0, "fb_used_bytes": 600 * 2**20}


def cause(values: dict[str, Any], **kw: Any) -> Cause | None:
    d = decide(values, T, **kw)
    return None if d is None else d.cause


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (TINY_KERNELS, Cause.LAUNCH_BOUND),
        (STARVED, Cause.INPUT_STARVED),
        (COPIES, Cause.TRANSFER_BOUND),
        (ELEMENTWISE, Cause.MEMORY_BOUND),
        (SGEMM, Cause.COMPUTE_NO_TENSOR),
        (BF16, Cause.COMPUTE_TENSOR),
        (HELD, Cause.IDLE_HELD),
        (EMPTY, Cause.IDLE_EMPTY),
    ],
)
def test_measured_samples_get_their_cause(values: dict[str, Any], expected: Cause) -> None:
    assert cause(values) is expected


def test_the_ladder_and_its_rung() -> None:
    assert activity({"sm_active": 0.2, "gr_engine_active": 0.5, "gpu_util": 0.9}) == (
        0.2, Rung.SM_ACTIVE,
    )  # fmt: skip
    assert activity({"gr_engine_active": 0.5, "gpu_util": 0.9}) == (0.5, Rung.GR_ENGINE_ACTIVE)
    assert activity({"gpu_util": 0.9}) == (0.9, Rung.GPU_UTIL)
    assert activity({"fb_used_bytes": 5.0}) is None
    assert decide({"power_watts": 80.0}, T) is None  # no activity figure: nodata, no cause


# Each edge: (values, cause just on one side, values, cause just on the other side).
EDGES: list[tuple[str, dict[str, Any], Cause, dict[str, Any], Cause]] = [
    (
        "idle threshold (activity below idle, no kernel)",
        {"sm_active": T.idle - EPS, "gpu_util": 0.0, "fb_used_bytes": 0},
        Cause.IDLE_EMPTY,
        {"sm_active": T.idle, "gpu_util": 0.0, "tensor_active": 0.0},
        Cause.INPUT_STARVED,  # running, duty 0 < starved_util
    ),
    (
        "no-kernel duty cycle (at or below it nothing ran)",
        {"sm_active": 0.0, "gpu_util": T.no_kernel_util, "fb_used_bytes": 0},
        Cause.IDLE_EMPTY,
        {"sm_active": 0.0, "gpu_util": T.no_kernel_util + EPS},
        Cause.INPUT_STARVED,
    ),
    (
        "video engines (busy from the idle threshold on)",
        {"sm_active": 0.0, "gpu_util": 0.0, "fb_used_bytes": 0, "dec_util": T.idle - EPS},
        Cause.IDLE_EMPTY,
        {"sm_active": 0.0, "gpu_util": 0.0, "fb_used_bytes": 0, "enc_util": T.idle},
        Cause.UNCLASSIFIED,
    ),
    (
        "held bytes (strictly above holds)",
        {"sm_active": 0.0, "gpu_util": 0.0, "fb_used_bytes": T.held_bytes},
        Cause.IDLE_EMPTY,
        {"sm_active": 0.0, "gpu_util": 0.0, "fb_used_bytes": T.held_bytes + 1},
        Cause.IDLE_HELD,
    ),
    (
        "transfer bytes per second",
        {"sm_active": 0.2, "gpu_util": 0.3, "pcie_tx_bytes_per_second": T.transfer_bytes_per_second - 1},
        Cause.INPUT_STARVED,
        {"sm_active": 0.2, "gpu_util": 0.3, "pcie_tx_bytes_per_second": T.transfer_bytes_per_second},
        Cause.TRANSFER_BOUND,
    ),
    (
        "transfer needs waiting SMs (busy threshold)",
        {"sm_active": T.busy, "gpu_util": 1.0, "pcie_rx_bytes_per_second": 10e9, "tensor_active": 0.5},
        Cause.COMPUTE_TENSOR,
        {"sm_active": T.busy - EPS, "gpu_util": 0.9, "pcie_rx_bytes_per_second": 10e9},
        Cause.TRANSFER_BOUND,
    ),
    (
        "launch: SM fill against the duty cycle",
        {"sm_active": 0.5 * T.launch_fill, "gpu_util": 0.5, "tensor_active": 0.5},
        Cause.COMPUTE_TENSOR,
        {"sm_active": 0.5 * T.launch_fill - EPS, "gpu_util": 0.5},
        Cause.LAUNCH_BOUND,
    ),
    (
        "launch: minimum duty cycle",
        {"sm_active": 0.0, "gpu_util": T.launch_min_util - EPS},
        Cause.INPUT_STARVED,
        {"sm_active": 0.0, "gpu_util": T.launch_min_util},
        Cause.LAUNCH_BOUND,
    ),
    (
        "starved: duty cycle below starved_util",
        {"sm_active": 0.4, "gpu_util": T.starved_util - EPS},
        Cause.INPUT_STARVED,
        {"sm_active": 0.4, "gpu_util": T.starved_util, "tensor_active": 0.0},
        Cause.COMPUTE_NO_TENSOR,
    ),
    (
        "memory: dram threshold",
        {"sm_active": 0.9, "gpu_util": 1.0, "dram_active": T.memory_dram - EPS, "tensor_active": 0.0},
        Cause.COMPUTE_NO_TENSOR,
        {"sm_active": 0.9, "gpu_util": 1.0, "dram_active": T.memory_dram, "tensor_active": 0.0},
        Cause.MEMORY_BOUND,
    ),
    (
        "tensor threshold",
        {"sm_active": 0.9, "gpu_util": 1.0, "tensor_active": T.tensor - EPS},
        Cause.COMPUTE_NO_TENSOR,
        {"sm_active": 0.9, "gpu_util": 1.0, "tensor_active": T.tensor},
        Cause.COMPUTE_TENSOR,
    ),
]  # fmt: skip


@pytest.mark.parametrize(("name", "a", "ca", "b", "cb"), EDGES, ids=[e[0] for e in EDGES])
def test_every_threshold_edge(
    name: str, a: dict[str, Any], ca: Cause, b: dict[str, Any], cb: Cause
) -> None:
    assert cause(a) is ca, name
    assert cause(b) is cb, name


def test_a_listed_process_holds_an_idle_gpu() -> None:
    assert cause(EMPTY) is Cause.IDLE_EMPTY
    assert cause(EMPTY, has_process=True) is Cause.IDLE_HELD
    assert cause(BF16, has_process=True) is Cause.COMPUTE_TENSOR


@pytest.mark.parametrize(
    "values",
    [TINY_KERNELS, STARVED, COPIES, ELEMENTWISE, SGEMM, BF16, HELD],
    ids=["tiny", "starved", "copies", "elementwise", "sgemm", "bf16", "held"],
)
def test_an_absent_metric_never_picks_a_cause(values: dict[str, Any]) -> None:
    """Dropping any one metric never yields a cause that needs that metric to be decided."""
    needs = {
        Cause.TRANSFER_BOUND: ("pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second"),
        Cause.MEMORY_BOUND: ("dram_active",),
        Cause.COMPUTE_NO_TENSOR: ("tensor_active",),
        Cause.COMPUTE_TENSOR: ("tensor_active",),
        Cause.LAUNCH_BOUND: ("sm_active",),
        Cause.INPUT_STARVED: ("sm_active",),
        # Without the memory figure "held" needs a job or a process, which these have none of.
        Cause.IDLE_HELD: ("fb_used_bytes",),
    }
    for dropped in values:
        rest = {k: v for k, v in values.items() if k != dropped}
        got = cause(rest)
        required = needs.get(got, ()) if got is not None else ()
        assert not required or any(m in rest for m in required), (dropped, got)
        if got is not None:
            assert got in supported_causes(rest) or got is Cause.UNCLASSIFIED


def test_coarse_only_gpus_get_only_the_causes_they_support() -> None:
    coarse = {"gpu_util": 1.0, "fb_used_bytes": 20 * GIB}
    assert supported_causes(coarse) == (Cause.IDLE_EMPTY, Cause.IDLE_HELD)
    assert cause(coarse) is Cause.UNCLASSIFIED  # busy, but nothing says why
    assert cause({"gpu_util": 0.0, "fb_used_bytes": 20 * GIB}) is Cause.IDLE_HELD
    # dcgm-exporter without SM_ACTIVE: the middle rung decides idleness; the rest need metrics.
    dcgm = {"gr_engine_active": 0.0, "fb_used_bytes": 20 * GIB}
    d = decide(dcgm, T)
    assert d is not None and d.rung is Rung.GR_ENGINE_ACTIVE and d.cause is Cause.IDLE_HELD
    assert cause({"gr_engine_active": 0.9, "tensor_active": 0.8}) is Cause.COMPUTE_TENSOR
    assert cause({"gr_engine_active": 0.9, "gpu_util": 0.9}) is Cause.UNCLASSIFIED


def test_names_are_the_design_names() -> None:
    assert CAUSE_NAMES[:8] == (
        "idle_empty", "idle_held", "launch_bound", "input_starved", "transfer_bound",
        "memory_bound", "compute_no_tensor", "compute_tensor",
    )  # fmt: skip


def test_sm_fill_is_compared_with_the_engine_activity_of_the_same_interval() -> None:
    # Recorded on the H200 (input-starved loop): NVML's duty cycle read 0.23 for a second in
    # which GPM saw the engine busy 0.12 of the time and the SMs 0.10.
    second = {"sm_active": 0.097, "gr_engine_active": 0.119, "gpu_util": 0.23}
    assert cause(second) is Cause.INPUT_STARVED
    # Without the engine figure the duty cycle is NVML's, and that second looks launch-bound.
    assert cause({"sm_active": 0.097, "gpu_util": 0.23}) is Cause.LAUNCH_BOUND


# An L40S on a stock dcgm-exporter decoding video: the SMs idle, NVDEC at 46% (the figure of
# tests/data/dcgm-exporter/mixed-node-lowercase-hostname.prom), memory held by the decoder.
DECODING = {"gr_engine_active": 0.0, "gpu_util": 0.0, "dec_util": 0.46, "enc_util": 0.0,
            "fb_used_bytes": 3 * GIB}  # fmt: skip


@pytest.mark.parametrize("engine", ["dec_util", "enc_util"])
def test_a_gpu_doing_video_work_is_not_idle(engine: str) -> None:
    values = {**DECODING, "dec_util": 0.0, engine: 0.46}
    got = cause(values)
    assert got is not None and got not in IDLE_CAUSES
    # Busy on the video engines, which no SM cause describes: not a waste cause either.
    assert got is Cause.UNCLASSIFIED
    # With GPM too (SM figures at zero), the video engines still keep it out of idle.
    assert cause({**values, "sm_active": 0.0, "tensor_active": 0.0}) is Cause.UNCLASSIFIED
    # Below the idle threshold the video engines are as idle as the SMs.
    assert cause({**values, engine: T.idle - EPS}) is Cause.IDLE_HELD


def test_video_work_beside_kernels_leaves_the_kernel_cause() -> None:
    assert cause({**BF16, "dec_util": 0.3}) is Cause.COMPUTE_TENSOR


def test_idle_gpu_without_memory_figures_is_held_only_by_a_job_or_a_process() -> None:
    # A stock exporter trimmed of its FB fields: nothing says memory is held, so a GPU no job
    # or process holds is empty, and one a serving pod holds is held.
    no_fb = {"gr_engine_active": 0.0, "gpu_util": 0.0}
    assert cause(no_fb) is Cause.IDLE_EMPTY
    assert cause(no_fb, has_job=True) is Cause.IDLE_HELD
    assert cause(no_fb, has_process=True) is Cause.IDLE_HELD
    assert supported_causes(no_fb) == (Cause.IDLE_EMPTY, Cause.IDLE_HELD)
    assert memory_unknown(no_fb) and not memory_unknown({**no_fb, "fb_used_bytes": 0})
    assert not memory_unknown({"fb_used_bytes": 0})  # no activity: no cause was decided
    # Reported memory still decides: a job holding the GPU with nothing in memory is
    # allocated but unused, empty.
    assert cause({**no_fb, "fb_used_bytes": 0}, has_job=True) is Cause.IDLE_EMPTY
    assert cause({**no_fb, "fb_used_bytes": 2 * GIB}) is Cause.IDLE_HELD
