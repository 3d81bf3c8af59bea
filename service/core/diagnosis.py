"""Activity, idleness and the cause of each sample, decided once from a sample's values.

Pure: a sample's canonical metric values and the thresholds in, a decision out. The cost
model, the rollups, the alert windows, /metrics and the API all read the decision stored with
the sample at ingest (see ``decide``), so they cannot disagree; a threshold change applies to
samples stored from then on.

Activity is one ladder: ``sm_active``, else ``gr_engine_active``, else ``gpu_util``, and every
decision records which rung it used. A metric a GPU does not report never decides a cause.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from functools import cached_property
from typing import NamedTuple, Protocol

GIB = 1024**3


class Rung(IntEnum):
    """Which metric a sample's activity came from (stored as a small integer)."""

    SM_ACTIVE = 1
    GR_ENGINE_ACTIVE = 2
    GPU_UTIL = 3

    @property
    def label(self) -> str:
        """The rung's name as the API and /metrics spell it (the metric's canonical name)."""
        return self.name.lower()


class Cause(IntEnum):
    """Why a covered second of a GPU went the way it did (stored as a small integer, its code;
    ``column`` is its place in every per-cause sequence)."""

    IDLE_EMPTY = 1  # nothing running, nothing held
    IDLE_HELD = 2  # nothing running, memory held
    LAUNCH_BOUND = 3  # kernels run much of the time but fill few SMs
    INPUT_STARVED = 4  # kernels fill the SMs when they run, but run a small share of the time
    TRANSFER_BOUND = 5  # host-device or peer copies while the SMs wait
    MEMORY_BOUND = 6  # SMs busy, DRAM bandwidth near its limit
    COMPUTE_NO_TENSOR = 7  # SMs busy, tensor pipes idle on a GPU that has them
    COMPUTE_TENSOR = 8  # SMs busy on tensor cores (healthy)
    # Something ran, but the GPU does not report the metrics that tell which of the above; or
    # only the video engines (NVENC/NVDEC) ran, which none of the above describes.
    UNCLASSIFIED = 9
    # Decided over a window of samples and the job's host side, never from one sample (see
    # service/core/useful_work.py): kernels that do no useful work (a keep-alive loop) ...
    SHAM = 10
    # ... and work resident on the GPU that has stopped advancing (a hung collective).
    HUNG = 11

    @cached_property  # kept on the member: reports ask for it tens of thousands of times
    def label(self) -> str:
        """The cause's canonical name (storage, API, CSV, CLI, policies)."""
        return self.name.lower()

    @cached_property
    def column(self) -> int:
        """The cause's place in every per-cause sequence (``CAUSES``, ``CAUSE_FIELDS``, a
        summary's USD per cause), as ``CAUSE_COLUMNS`` declares it."""
        return CAUSE_COLUMNS[self]


# Each cause's column, declared once and never derived from its code: a new cause is appended
# with the next code and the next column, never inserted (tests/unit/test_cause_columns_order.py
# says why).
CAUSE_COLUMNS: dict[Cause, int] = {
    Cause.IDLE_EMPTY: 0,
    Cause.IDLE_HELD: 1,
    Cause.LAUNCH_BOUND: 2,
    Cause.INPUT_STARVED: 3,
    Cause.TRANSFER_BOUND: 4,
    Cause.MEMORY_BOUND: 5,
    Cause.COMPUTE_NO_TENSOR: 6,
    Cause.COMPUTE_TENSOR: 7,
    Cause.UNCLASSIFIED: 8,
    Cause.SHAM: 9,
    Cause.HUNG: 10,
}
# Every cause in column order: the order of every per-cause sequence.
CAUSES: tuple[Cause, ...] = tuple(sorted(Cause, key=CAUSE_COLUMNS.__getitem__))
CAUSE_NAMES: tuple[str, ...] = tuple(c.label for c in CAUSES)
CAUSE_BY_NAME: dict[str, Cause] = {c.label: c for c in CAUSES}
# Nothing ran: the causes "idle" means everywhere (a report's idle dollars, the fleet's idle GPUs).
IDLE_CAUSES: tuple[Cause, ...] = (Cause.IDLE_EMPTY, Cause.IDLE_HELD)
# Causes that are waste of their own kind (a report's dominant waste cause is one of these).
WASTE_CAUSES: tuple[Cause, ...] = (
    Cause.IDLE_EMPTY,
    Cause.IDLE_HELD,
    Cause.LAUNCH_BOUND,
    Cause.INPUT_STARVED,
    Cause.TRANSFER_BOUND,
    Cause.MEMORY_BOUND,
    Cause.COMPUTE_NO_TENSOR,
    Cause.SHAM,
    Cause.HUNG,
)
# Activity that does no useful work: its whole cost is saved by releasing the GPU, as an idle
# GPU's is (the money model's recoverable share 1.0; the idle policy's ladder covers them).
USELESS_CAUSES: tuple[Cause, ...] = (Cause.SHAM, Cause.HUNG)
# What each cause means, in the words the console, the CLI, the policy list and docs/diagnosis.md
# show; what to do about it is CAUSE_FIX's.
CAUSE_MEANING: dict[Cause, str] = {
    Cause.IDLE_EMPTY: "nothing running, nothing held (allocated but unused)",
    Cause.IDLE_HELD: "nothing running, memory held (a process listed, or more than the held "
    "threshold; where memory is not reported, a job or a process holds the GPU)",
    Cause.LAUNCH_BOUND: "kernels run much of the time but occupy few SMs",
    Cause.INPUT_STARVED: "full-size kernels run only a small part of the time",
    Cause.TRANSFER_BOUND: "host-device (or peer) copies while the SMs wait",
    Cause.MEMORY_BOUND: "SMs busy, DRAM bandwidth near its limit",
    Cause.COMPUTE_NO_TENSOR: "SMs busy, tensor pipes idle on a GPU that has them",
    Cause.COMPUTE_TENSOR: "SMs busy on tensor cores (healthy)",
    Cause.UNCLASSIFIED: "something ran, but the GPU does not report the metrics that tell which "
    "of the above; or only the video engines (NVENC/NVDEC) were busy",
    Cause.SHAM: "kernels run but do no useful work: a steady synthetic pattern with no input "
    "read and no progress (a keep-alive loop), held for the useful-work window",
    Cause.HUNG: "kernels stay resident but the job has stopped advancing (a collective "
    "waiting on a dead peer), held for the useful-work window",
}
# The fix of each waste cause, as every report, alert and page names it.
CAUSE_FIX: dict[Cause, str] = {
    Cause.IDLE_EMPTY: "release the GPU when nothing runs (shorter allocations, end the job "
    "when its work is done)",
    Cause.IDLE_HELD: "end the idle process or add an idle timeout, so the GPU is released",
    Cause.LAUNCH_BOUND: "launch fewer, larger kernels: CUDA graphs, torch.compile, operator "
    "fusion, larger batches",
    Cause.INPUT_STARVED: "feed the GPU faster: more DataLoader workers, pin_memory, "
    "prefetching, decode on the GPU",
    Cause.TRANSFER_BOUND: "pinned buffers, async copies on their own stream overlapping "
    "compute, keep the data on the GPU",
    Cause.MEMORY_BOUND: "move fewer bytes: fuse the chain of kernels (torch.compile), "
    "FlashAttention-style kernels, a narrower dtype where the maths allows",
    Cause.COMPUTE_NO_TENSOR: "run the matrix maths on tensor cores: bf16/fp16 autocast, or "
    "TF32 (torch.backends.cuda.matmul.allow_tf32 = True)",
    Cause.SHAM: "release the GPU: a loop that keeps it busy does no work (label benchmarks "
    "and burn-in runs gpuwarden.io/exempt-useful-work)",
    Cause.HUNG: "end the job and restart it from its last checkpoint; find the dead or "
    "stalled rank (NCCL_DEBUG=INFO, a collective timeout)",
}


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Every threshold of the waste model and of the causes (ratios unless the name has a unit).

    ``max_gap_seconds`` caps how long one sample stands for; ``idle`` is the activity below
    which nothing runs (with ``no_kernel_util``, the duty cycle at or below which no kernel
    ran); ``held_bytes`` is the memory above which an idle GPU is held. The rest order the
    causes of a running sample; docs/diagnosis.md gives the measurements behind each.
    """

    max_gap_seconds: float = 60.0
    idle: float = 0.05
    held_bytes: float = float(GIB)
    no_kernel_util: float = 0.02
    transfer_bytes_per_second: float = 2e9
    busy: float = 0.5
    launch_min_util: float = 0.1
    launch_fill: float = 0.5
    starved_util: float = 0.5
    memory_dram: float = 0.5
    tensor: float = 0.05


class ThresholdSettings(Protocol):
    """The settings the thresholds come from (service.settings.Settings has them)."""

    @property
    def max_gap_seconds(self) -> float: ...
    @property
    def idle_threshold(self) -> float: ...
    @property
    def held_threshold_bytes(self) -> int: ...
    @property
    def cause_no_kernel_util(self) -> float: ...
    @property
    def cause_transfer_bytes_per_second(self) -> float: ...
    @property
    def cause_busy(self) -> float: ...
    @property
    def cause_launch_min_util(self) -> float: ...
    @property
    def cause_launch_fill(self) -> float: ...
    @property
    def cause_starved_util(self) -> float: ...
    @property
    def cause_memory_dram(self) -> float: ...
    @property
    def cause_tensor(self) -> float: ...


def thresholds_of(s: ThresholdSettings) -> Thresholds:
    """The thresholds the settings ``s`` give (the one place they are read)."""
    return Thresholds(
        max_gap_seconds=s.max_gap_seconds,
        idle=s.idle_threshold,
        held_bytes=float(s.held_threshold_bytes),
        no_kernel_util=s.cause_no_kernel_util,
        transfer_bytes_per_second=s.cause_transfer_bytes_per_second,
        busy=s.cause_busy,
        launch_min_util=s.cause_launch_min_util,
        launch_fill=s.cause_launch_fill,
        starved_util=s.cause_starved_util,
        memory_dram=s.cause_memory_dram,
        tensor=s.cause_tensor,
    )


class Decision(NamedTuple):
    """One sample's activity (ratio), the rung it came from, and its cause."""

    activity: float
    rung: Rung
    cause: Cause


_LADDER: tuple[tuple[str, Rung], ...] = (
    ("sm_active", Rung.SM_ACTIVE),
    ("gr_engine_active", Rung.GR_ENGINE_ACTIVE),
    ("gpu_util", Rung.GPU_UTIL),
)
_TRAFFIC = (
    "pcie_tx_bytes_per_second",
    "pcie_rx_bytes_per_second",
    "nvlink_tx_bytes_per_second",
    "nvlink_rx_bytes_per_second",
)


def activity(values: Mapping[str, float | None]) -> tuple[float, Rung] | None:
    """The sample's activity ratio and its rung, or None when no rung is reported (no data)."""
    for name, rung in _LADDER:
        v = values.get(name)
        if v is not None:
            return float(v), rung
    return None


def duty_of(values: Mapping[str, float | None], rung: Rung) -> float | None:
    """The share of time kernels ran, when it is a different figure from the activity.

    Beside SM activity, the graphics-engine activity of the same profiling interval comes
    first: on an H200 NVML's duty cycle, sampled over its own shorter periods, read 0.22
    for seconds in which GPM saw the engine busy 0.13 of the time (docs/diagnosis.md).
    """
    if rung is Rung.SM_ACTIVE:
        engine = values.get("gr_engine_active")
        if engine is not None:
            return float(engine)
    util = values.get("gpu_util")
    if util is not None and rung is not Rung.GPU_UTIL:
        return float(util)
    return None


def _traffic(values: Mapping[str, float | None]) -> float | None:
    total = None
    for name in _TRAFFIC:
        v = values.get(name)
        if v is not None:
            total = (total or 0.0) + v
    return total


_VIDEO = ("enc_util", "dec_util")


def nothing_running(values: Mapping[str, float | None], act: float, t: Thresholds) -> bool:
    """No kernel ran: the duty cycle (where reported) at or below ``no_kernel_util`` and the
    activity below ``idle``."""
    util = values.get("gpu_util")
    return act < t.idle and (util is None or util <= t.no_kernel_util)


def video_busy(values: Mapping[str, float | None], t: Thresholds) -> bool:
    """The video encoder or decoder (where reported) was busy at least ``idle`` of the time.

    Neither the SM figures nor NVML's duty cycle count NVENC/NVDEC work, so a GPU that only
    decodes reads 0 on every rung; this keeps it out of the idle causes.
    """
    return any((v := values.get(name)) is not None and v >= t.idle for name in _VIDEO)


def held(
    values: Mapping[str, float | None], has_process: bool, has_job: bool, t: Thresholds
) -> bool:
    """Memory is held: a process is listed on the GPU or more than ``held_bytes`` is in use;
    where the GPU does not report its memory use, a process or a job holds it.

    An exporter without the framebuffer fields says nothing of memory, so "held" must come
    from what holds the GPU; a GPU no job or process holds is empty, not held by nobody.
    """
    fb = values.get("fb_used_bytes")
    if fb is None:
        return has_process or has_job
    return has_process or fb > t.held_bytes


def memory_unknown(values: Mapping[str, float | None]) -> bool:
    """The sample reports activity but not memory use, so an idle cause was decided without
    it (from the jobs and processes holding the GPU)."""
    return activity(values) is not None and values.get("fb_used_bytes") is None


def classify(
    values: Mapping[str, float | None],
    act: float,
    rung: Rung,
    t: Thresholds,
    *,
    has_process: bool = False,
    has_job: bool = False,
) -> Cause:
    """The cause of a sample whose activity is ``act`` from ``rung``, trying each in order."""
    if nothing_running(values, act, t):
        if video_busy(values, t):
            # Busy on the video engines, which no SM cause describes: busy, not waste.
            return Cause.UNCLASSIFIED
        return Cause.IDLE_HELD if held(values, has_process, has_job, t) else Cause.IDLE_EMPTY
    traffic = _traffic(values)
    if traffic is not None and traffic >= t.transfer_bytes_per_second and act < t.busy:
        return Cause.TRANSFER_BOUND
    duty = duty_of(values, rung)
    # Launch-bound and input-starved compare SM fill with the duty cycle: only SM activity
    # says how full the SMs were, so the coarser rungs never pick either.
    if rung is Rung.SM_ACTIVE and duty is not None:
        if duty >= t.launch_min_util and act < t.launch_fill * duty:
            return Cause.LAUNCH_BOUND
        if duty < t.starved_util:
            return Cause.INPUT_STARVED
    dram = values.get("dram_active")
    if dram is not None and dram >= t.memory_dram:
        return Cause.MEMORY_BOUND
    tensor = values.get("tensor_active")
    if tensor is not None:
        # A GPU that reports tensor-pipe activity has tensor cores (profiling counters
        # exist from Volta on, and every such GPU has them).
        return Cause.COMPUTE_TENSOR if tensor >= t.tensor else Cause.COMPUTE_NO_TENSOR
    return Cause.UNCLASSIFIED


def decide(
    values: Mapping[str, float | None],
    t: Thresholds,
    *,
    has_process: bool = False,
    has_job: bool = False,
) -> Decision | None:
    """Activity, rung and cause of one sample (``has_process``: a process is listed on the GPU;
    ``has_job``: a job holds it); None when it reports no activity (no data)."""
    found = activity(values)
    if found is None:
        return None
    act, rung = found
    cause = classify(values, act, rung, t, has_process=has_process, has_job=has_job)
    return Decision(act, rung, cause)


def supported_causes(values: Mapping[str, float | None]) -> tuple[Cause, ...]:
    """The causes a GPU reporting these metrics can be given (the others need metrics it
    lacks); empty when it reports no activity."""
    found = activity(values)
    if found is None:
        return ()
    rung = found[1]
    # Without the memory figure the jobs and processes holding the GPU tell the two apart.
    out = list(IDLE_CAUSES)
    if _traffic(values) is not None:
        out.append(Cause.TRANSFER_BOUND)
    if rung is Rung.SM_ACTIVE and duty_of(values, rung) is not None:
        out += [Cause.LAUNCH_BOUND, Cause.INPUT_STARVED]
    if values.get("dram_active") is not None:
        out.append(Cause.MEMORY_BOUND)
    if values.get("tensor_active") is not None:
        out += [Cause.COMPUTE_NO_TENSOR, Cause.COMPUTE_TENSOR]
    return tuple(sorted(out))


# --- GPU states ----------------------------------------------------------------------------


class GpuState(StrEnum):
    """What a GPU is doing now, as every surface names it (fleet API, CLI, console).

    It follows the cause of the GPU's latest sample (see the mapping below): ``working`` only
    where the SMs are busy on real work, ``underused`` where kernels run but leave most of the
    GPU waiting (tiny kernels, starved input, copies), the two idle states, and three states
    that are not a cause: the GPU fell off the bus, sent nothing for a while, or cannot tell.
    Declared worst first: lists sort GPUs of equal waste in this order.
    """

    LOST = "lost"
    IDLE_HELD = "idle-held"
    IDLE = "idle"
    UNDERUSED = "underused"
    SHAM = "sham"
    HUNG = "hung"
    NO_DATA = "no-data"
    UNCLASSIFIED = "unclassified"
    WORKING = "working"


STATE_OF_CAUSE: dict[Cause, GpuState] = {
    Cause.COMPUTE_TENSOR: GpuState.WORKING,
    Cause.MEMORY_BOUND: GpuState.WORKING,
    Cause.COMPUTE_NO_TENSOR: GpuState.WORKING,
    Cause.LAUNCH_BOUND: GpuState.UNDERUSED,
    Cause.INPUT_STARVED: GpuState.UNDERUSED,
    Cause.TRANSFER_BOUND: GpuState.UNDERUSED,
    Cause.IDLE_HELD: GpuState.IDLE_HELD,
    Cause.IDLE_EMPTY: GpuState.IDLE,
    Cause.UNCLASSIFIED: GpuState.UNCLASSIFIED,
    Cause.SHAM: GpuState.SHAM,
    Cause.HUNG: GpuState.HUNG,
}
# Busy SMs doing their work slowly: ``working`` only while the fix would recover under
# FIXABLE_STATE_SHARE of the time (from the sample's own signal); at that share or more (or where
# the share is not known) the GPU is ``underused``: green never shows a large fixable waste.
FIXABLE_CAUSES: frozenset[Cause] = frozenset({Cause.MEMORY_BOUND, Cause.COMPUTE_NO_TENSOR})
FIXABLE_STATE_SHARE = 0.25
STATES: tuple[GpuState, ...] = tuple(GpuState)
STATE_NAMES: tuple[str, ...] = tuple(s.value for s in STATES)
STATE_MEANING: dict[GpuState, str] = {
    GpuState.LOST: "the GPU fell off the bus",
    GpuState.IDLE_HELD: "nothing running, memory held (where memory is not reported: a job "
    "or a process holds it)",
    GpuState.IDLE: "nothing running, nothing held",
    GpuState.UNDERUSED: "kernels run but most of the GPU waits: tiny kernels, starved input "
    "or host-device copies; or the SMs are busy but their fix (memory-bound: fewer bytes; no "
    "tensor cores: bf16 or TF32) would save 25% of the time or more",
    GpuState.SHAM: "kernels run but do no useful work (a keep-alive loop)",
    GpuState.HUNG: "kernels resident, the job stopped advancing (hung)",
    GpuState.NO_DATA: "no sample for 2 minutes: the figures are not current",
    GpuState.UNCLASSIFIED: "busy; this GPU does not report the metrics that tell why",
    GpuState.WORKING: "SMs busy on real work (memory-bound or without tensor cores only where "
    "the fix would save under 25% of the time)",
}
# States whose GPUs waste what they cost: nothing runs, or most of the GPU waits.
WASTE_STATES: frozenset[GpuState] = frozenset(
    {GpuState.IDLE_HELD, GpuState.IDLE, GpuState.UNDERUSED, GpuState.SHAM, GpuState.HUNG}
)
# No sample for this long: a GPU's latest cause no longer says what it is doing now.
STALE_SECONDS = 120.0


def gpu_state(
    *,
    cause: Cause | None,
    lost: bool,
    age_seconds: float | None,
    fixable_share: float | None = None,
) -> GpuState:
    """A GPU's state from its latest sample's cause, that sample's age in seconds (None: never
    sampled) and, for a cause of FIXABLE_CAUSES, the share of the sample's time its fix would
    recover (None: not known, taken as large); a lost GPU is lost whatever it sent last."""
    if lost:
        return GpuState.LOST
    if cause is None or age_seconds is None or age_seconds > STALE_SECONDS:
        return GpuState.NO_DATA
    if cause in FIXABLE_CAUSES and (fixable_share is None or fixable_share >= FIXABLE_STATE_SHARE):
        return GpuState.UNDERUSED
    return STATE_OF_CAUSE[cause]


def causes_of_state(state: GpuState) -> tuple[Cause, ...]:
    """The causes whose GPUs may be in ``state`` (none for lost and no-data): those of
    FIXABLE_CAUSES are in ``working`` and in ``underused``, by their fix's share."""
    return tuple(
        c
        for c in CAUSES
        if STATE_OF_CAUSE.get(c) is state or (state is GpuState.UNDERUSED and c in FIXABLE_CAUSES)
    )
