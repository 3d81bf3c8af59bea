"""The share of an inefficient cause's time its fix recovers, from the group's own signals.

Pure: a group's integrals (seconds per cause and the signals of ``CAUSE_SIGNALS`` summed over
them), its GPU model and the fallback constant in; the share (a ratio in [0, 1]), the formula
with its inputs, and whether the constant was used, out. Each formula is a time per unit of
work after the fix over the time before, from what the samples measured against what the GPU
can reach: its datasheet peaks (``GPU_PEAKS``) and targets measured on an NVIDIA H200
(``TARGETS``, docs/gpu-check/calibration/). Where a signal is missing (buckets stored before
the signals were, a GPU without the metric, a model not in the table) the constant stays, and
the formula says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.core.diagnosis import Cause
from service.costs.integrals import CAUSE_SIGNALS, Integrals

__all__ = [
    "GPU_PEAKS",
    "PEAKS_SOURCE",
    "TARGETS",
    "GpuPeaks",
    "Share",
    "Targets",
    "mean_signal",
    "pcie_bytes_per_second",
    "peaks_of",
    "recoverable_share",
]


@dataclass(frozen=True, slots=True)
class GpuPeaks:
    """A GPU model's datasheet peaks: dense fp32 and bf16/fp16 tensor TFLOP/s, HBM TB/s and
    its host link (PCIe generation and lanes)."""

    pattern: str  # a regular expression matched against NVML's model name (case-insensitive)
    fp32_tflops: float
    bf16_dense_tflops: float
    hbm_tb_per_second: float
    pcie_gen: int
    pcie_lanes: int = 16
    # How many times faster fp32 GEMMs ran under bf16 autocast, measured on this model (None:
    # never measured here; the conservative fix_tensor_speedup stands in).
    measured_tensor_speedup: float | None = None
    measured_source: str = ""  # where and when that speed-up was measured

    @property
    def tensor_ratio(self) -> float:
        """How many times faster dense bf16 tensor maths is than fp32 (datasheet peaks)."""
        return self.bf16_dense_tflops / self.fp32_tflops


# NVIDIA datasheets, dense figures (the "with sparsity" ones halved): H200 (SXM and NVL,
# nvidia.com/en-us/data-center/h200), H100 (SXM, PCIe, NVL, .../h100), A100 (SXM/PCIe 40 and
# 80 GB, .../a100), L40S (.../l40s), L4 (.../l4), A10 (.../products/a10-gpu). A MIG instance's
# name contains its parent's, so it gets the parent's ratios and link. More specific names
# first: "H100 PCIe" before "H100".
GPU_PEAKS: tuple[GpuPeaks, ...] = (
    GpuPeaks(r"H200\s*NVL", 60.0, 835.0, 4.8, 5),
    GpuPeaks(
        r"H200",
        67.0,
        989.0,
        4.8,
        5,
        measured_tensor_speedup=86.70 / 7.42,
        measured_source="measured on an NVIDIA H200 SXM, 2026-12-04: 4 fp32 GEMMs of 8192 x 8192 "
        "a step (TF32 off) 86.70 ms, the same under bf16 autocast 7.42 ms, "
        "docs/gpu-check/calibration/",
    ),
    GpuPeaks(r"H100\s*PCIe", 51.0, 756.0, 2.0, 5),
    GpuPeaks(r"H100\s*NVL", 60.0, 835.0, 3.9, 5),
    GpuPeaks(
        r"H100",
        67.0,
        989.0,
        3.35,
        5,
        measured_tensor_speedup=85.49 / 7.32,
        measured_source="measured on an NVIDIA H100 80GB HBM3, 2026-12-07: the same GEMMs "
        "85.49 ms in fp32, 7.32 ms under bf16 autocast, docs/gpu-check/savings/",
    ),
    GpuPeaks(r"A100.*40\s*GB", 19.5, 312.0, 1.555, 4),
    GpuPeaks(r"A100", 19.5, 312.0, 2.039, 4),
    GpuPeaks(r"L40S", 91.6, 362.0, 0.864, 4),
    GpuPeaks(r"\bL4\b", 30.3, 121.0, 0.3, 4),
    GpuPeaks(r"\bA10\b", 31.2, 125.0, 0.6, 4),
)
PEAKS_SOURCE = (
    "NVIDIA datasheets, dense peaks: H200 SXM fp32 67 TFLOPS, bf16 989 (14.8x), HBM3e 4.8 TB/s, "
    "PCIe Gen5 x16; H100 SXM 67 / 989, 3.35 TB/s; H100 PCIe 51 / 756; A100 19.5 / 312 (16x), "
    "PCIe Gen4; L40S 91.6 / 362 (4x); L4 30.3 / 121"
)
_PATTERNS = tuple((re.compile(p.pattern, re.IGNORECASE), p) for p in GPU_PEAKS)


def peaks_of(model: str | None) -> GpuPeaks | None:
    """The datasheet peaks of a GPU model by its NVML name, None if not in GPU_PEAKS."""
    if not model:
        return None
    for pattern, peaks in _PATTERNS:
        if pattern.search(model):
            return peaks
    return None


# PCIe per lane and direction: transfer rate (GT/s) and line-code efficiency (PCI-SIG: 128b/130b
# from Gen3 to Gen5; Gen6 FLIT mode carries 242 payload bytes of 256).
_PCIE_LANE = {3: (8.0, 128 / 130), 4: (16.0, 128 / 130), 5: (32.0, 128 / 130), 6: (64.0, 242 / 256)}


def pcie_bytes_per_second(gen: int, lanes: int) -> float:
    """A PCIe link's raw bandwidth one way (bytes per second): Gen5 x16 is 63.0 GB/s."""
    rate, code = _PCIE_LANE[gen]
    return rate * 1e9 * code * lanes / 8.0


@dataclass(frozen=True, slots=True)
class Targets:
    """What a fed GPU reaches, measured on an NVIDIA H200 with the real agent (GPM, 1 s) on
    work other than the calibration pairs (docs/gpu-check/calibration/, the ``:target`` runs).

    ``fed_duty``: the engine duty cycle of bf16 GEMMs back to back from data on the GPU.
    ``graph_duty``: the duty cycle tiny kernels replayed from one CUDA graph reach.
    ``graph_engine_ratio``: a tiny kernel's engine time replayed from a graph over its engine
    time launched alone (the engine starts each lone launch from idle).
    ``launch_busy_duty``: at or above this duty the kernels already run back to back, so
    fewer launches save nothing measurable.
    ``pcie_practical_share``: pinned copies async on two streams, one way, over the link's raw
    bandwidth. ``at_peak_share``: copies at or above this share of that practical peak are at
    the link's limit. ``dram_practical``: the DRAM activity a device-to-device copy reaches.
    """

    fed_duty: float = 0.991
    graph_duty: float = 0.974
    graph_engine_ratio: float = 0.419  # 0.974 x 0.885 us over 0.200 x 10.26 us a kernel
    launch_busy_duty: float = 0.9
    pcie_practical_share: float = 0.923  # 58.2 of 63.0 GB/s on PCIe Gen5 x16
    at_peak_share: float = 0.9
    dram_practical: float = 0.871


TARGETS = Targets()
_WHERE = "measured on an H200, docs/gpu-check/calibration/"


@dataclass(frozen=True, slots=True)
class Share:
    """A fix's recoverable share of its cause's time (ratio in [0, 1]), the formula with its
    inputs, whether the constant was used, and the fix to name instead of the cause's usual
    one where the signals say that fix is already applied (None: the usual one)."""

    share: float
    formula: str
    fallback: bool
    action: str | None = None


_SIGNAL_FIELD = {s.cause: s.field for s in CAUSE_SIGNALS}


def mean_signal(usage: Integrals, cause: Cause) -> float | None:
    """The mean of the cause's signal over its seconds (None: no seconds, or no signal is
    stored for the cause); 0 when nothing was measured."""
    field = _SIGNAL_FIELD.get(cause)
    seconds: float = getattr(usage, f"{cause.label}_seconds")
    if field is None or seconds <= 1e-9:
        return None
    total: float = getattr(usage, field)
    return total / seconds


def _clamp(x: float) -> float:
    return min(1.0, max(0.0, x))


def recoverable_share(
    cause: Cause,
    usage: Integrals,
    model: str | None,
    fallback: tuple[float, str],
    *,
    memory_speedup: float = 2.0,
    tensor_speedup: float = 4.0,
    launch_min_util: float = 0.1,
    transfer_bytes_per_second: float = 2e9,
    targets: Targets = TARGETS,
) -> Share:
    """The recoverable share of ``cause``'s time in ``usage`` on a GPU of ``model``;
    ``fallback`` (share, why) where the signals cannot tell. ``launch_min_util`` and
    ``transfer_bytes_per_second`` are the rule floors below which a mean says its signal
    went unmeasured."""
    m = mean_signal(usage, cause)

    def constant(why: str) -> Share:
        return Share(fallback[0], f"{fallback[1]} (constant: {why})", True)

    if m is None:
        return constant("no signal stored for this cause")
    if cause is Cause.INPUT_STARVED:
        return _starved(m, targets) if m > 1e-6 else constant("no duty cycle measured")
    if cause is Cause.LAUNCH_BOUND:
        if m < 0.99 * launch_min_util:
            return constant("no duty cycle measured")
        return _launch(m, targets)
    if cause is Cause.COMPUTE_NO_TENSOR:
        peaks = peaks_of(model)
        if peaks is None:
            return constant(f"no datasheet peaks for {model or 'GPUs of several models'}")
        return _tensor(m, peaks, tensor_speedup) if m > 1e-6 else constant("no SM activity stored")
    if cause is Cause.MEMORY_BOUND:
        if m <= 1e-6:
            return constant("no DRAM activity measured")
        return _memory(m, memory_speedup, targets)
    if cause is Cause.TRANSFER_BOUND:
        peaks = peaks_of(model)
        if peaks is None:
            return constant(f"no link figures for {model or 'GPUs of several models'}")
        if m < 0.99 * transfer_bytes_per_second:
            return constant(f"PCIe moved {m / 1e9:.2g} GB/s: the copies went over another link")
        return _transfer(m, peaks, targets)
    return constant("no formula for this cause")


def _starved(duty: float, t: Targets) -> Share:
    share = _clamp(1.0 - duty / t.fed_duty)
    return Share(
        share,
        f"1 - duty {duty:.3f} / {t.fed_duty:.3f} = {share:.0%}: kernels ran {duty:.1%} of this "
        f"time; fed, the same kernels run back to back at the duty a fed GPU reaches "
        f"({t.fed_duty:.3f}, {_WHERE})",
        False,
    )


def _launch(duty: float, t: Targets) -> Share:
    if duty >= t.launch_busy_duty:
        return Share(
            0.0,
            f"duty {duty:.3f} >= {t.launch_busy_duty:g}: the tiny kernels already run back to "
            f"back, so fewer launches (CUDA graphs) save nothing measurable; fusing them or "
            f"batching more work per kernel fills the SMs, by an amount no signal measures "
            f"(no saving promised)",
            False,
            action="fuse the tiny kernels or batch more work per kernel (torch.compile, "
            "horizontal fusion, larger batches): they already run back to back",
        )
    r, g = t.graph_engine_ratio, t.graph_duty
    share = _clamp(1.0 - r * duty / g)
    return Share(
        share,
        f"1 - {r:g} x duty {duty:.3f} / {g:.3f} = {share:.0%}: launched one by one the engine "
        f"was busy {duty:.1%} of this time; replayed from a CUDA graph each tiny kernel takes "
        f"{r:g} of that engine time at duty {g:.3f} ({_WHERE})",
        False,
    )


def _tensor(activity: float, p: GpuPeaks, conservative_speedup: float) -> Share:
    """The busy part's time saved on tensor cores: at the speed-up measured on this model where
    one was, else at a conservative one (never the datasheet's peak ratio, which no training
    step reaches: only its matrix maths moves to tensor cores)."""
    ratio = p.tensor_ratio
    datasheet = (
        f"the datasheet's dense bf16 {p.bf16_dense_tflops:g} vs fp32 {p.fp32_tflops:g} TFLOPS "
        f"({ratio:.1f}x) is a ceiling no whole step reaches"
    )
    measured = p.measured_tensor_speedup
    gain = min(measured if measured is not None else conservative_speedup, ratio)
    share = _clamp(activity * (1.0 - 1.0 / gain))
    if measured is not None:
        why = (
            f"SM activity {activity:.3f} x (1 - 1/{gain:.1f}) = {share:.0%}: fp32 matrix maths "
            f"ran {gain:.1f}x faster on tensor cores ({p.measured_source}); {datasheet}; "
            f"work other than matrix maths speeds up less"
        )
    else:
        why = (
            f"SM activity {activity:.3f} x (1 - 1/{gain:g}) = {share:.0%}: a conservative "
            f"{gain:g}x (setting fix_tensor_speedup), as no speed-up was measured on this model; "
            f"{datasheet}, and fp32 GEMMs measured 11.7x on an H200"
        )
    return Share(share, why, False)


def _memory(dram: float, speedup: float, t: Targets) -> Share:
    bound = min(1.0, dram / t.dram_practical)
    share = _clamp(bound * (1.0 - 1.0 / speedup))
    return Share(
        share,
        f"min(1, DRAM {dram:.3f} / {t.dram_practical:.3f}) x (1 - 1/{speedup:g}) = {share:.0%}: "
        f"{bound:.0%} of this time waited on DRAM (a copy reaches {t.dram_practical:.3f}, "
        f"{_WHERE}); moving 1/{speedup:g} of the bytes (setting fix_memory_speedup) saves that "
        f"part only",
        False,
    )


def _transfer(rate: float, p: GpuPeaks, t: Targets) -> Share:
    raw = pcie_bytes_per_second(p.pcie_gen, p.pcie_lanes)
    link = raw * t.pcie_practical_share
    used = rate / link
    where = (
        f"PCIe Gen{p.pcie_gen} x{p.pcie_lanes}: {raw / 1e9:.1f} GB/s one way, pinned async "
        f"copies reach {t.pcie_practical_share:.1%} of it, {_WHERE}"
    )
    if used >= t.at_peak_share:
        return Share(
            0.0,
            f"the copies moved {rate / 1e9:.1f} GB/s, {used:.0%} of the link's practical "
            f"{link / 1e9:.1f} GB/s ({where}): already at its limit, so pinned or async copies "
            f"save nothing; fewer bytes would, by an amount no signal measures (no saving "
            f"promised)",
            False,
            action="move fewer bytes: keep the data resident on the GPU, copy once and reuse, "
            "send compact dtypes; the copies already run at the link's limit",
        )
    share = _clamp(1.0 - used)
    return Share(
        share,
        f"1 - {rate / 1e9:.1f} / {link / 1e9:.1f} GB/s = {share:.0%}: the copies moved "
        f"{rate / 1e9:.1f} GB/s (the busier direction) on a link whose pinned async copies "
        f"carry {link / 1e9:.1f} ({where})",
        False,
    )
