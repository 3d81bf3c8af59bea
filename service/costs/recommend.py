"""What to do about a job's waste and what it would save (USD), with the assumption behind each.

Pure: a job's (or a report group's) summary in, recommendations out. Every covered second has
one cause and each cause one fix, so a cause's dollars go to its fix only; asking for fewer GPUs
takes the idle seconds of the GPUs it gives back away from the idle fixes, and a smaller MIG
slice is priced on what the other fixes leave (service.costs.rightsizing). The savings of a job
therefore add up to at most its cost, whichever of them it acts on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Literal, assert_never

from service.core.diagnosis import CAUSE_FIX, CAUSE_NAMES, IDLE_CAUSES, Cause
from service.costs.integrals import Integrals
from service.costs.recoverable import recoverable_share
from service.costs.waste import UNALLOCATED, Summary

FixKind = Literal["cause", "fewer_gpus", "mig", "pool"]

# Where the tensor-core speed-up's default comes from (docs/diagnosis.md repeats it).
TENSOR_SPEEDUP_SOURCE = (
    "NVIDIA datasheets: A100 FP32 19.5 TFLOPS vs TF32 tensor 156 (8x), bf16 312 (16x); "
    "H100 SXM FP32 67 vs TF32 495 (7.4x), bf16 989 (14.8x); the default takes the low end "
    "of the 4-8x that whole matrix ops see, since they also read memory"
)


@dataclass(frozen=True, slots=True)
class FixAssumptions:
    """The figures a saving is estimated with (ratios; speed-ups are how many times faster).

    ``starved_util``, ``launch_fill`` and ``busy`` are the thresholds that named the causes:
    an input-starved second ran kernels under ``starved_util`` of the time, a launch-bound
    one filled under ``launch_fill`` of the SMs, a transfer-bound one kept the SMs busy under
    ``busy``; fixed, the same work needs at most that share of the time.
    """

    tensor_speedup: float = 4.0
    memory_speedup: float = 2.0
    starved_util: float = 0.5
    launch_fill: float = 0.5
    busy: float = 0.5
    idle_gpu_fraction: float = 0.8  # a GPU idle this share of its time counts as not needed
    mig_memory_headroom: float = 0.9  # the job's peak memory at most this share of the slice's
    # The rule floors the recoverable shares read an unmeasured signal by (cause thresholds).
    launch_min_util: float = 0.1
    transfer_bytes_per_second: float = 2e9
    # The GPU model the shares are computed for (datasheet peaks); None: several or unknown.
    gpu_model: str | None = None
    # NVLink traffic above this (bytes/s, busiest minute, each way) means the GPU talks to its
    # peers: no MIG slice (MIG has no GPU-to-GPU P2P) and not a GPU to give back.
    nvlink_min_bytes_per_second: float = 1e8
    # A job copy-bound this share of its running time or more waits on the copy engines of a
    # whole GPU already: a slice, with a fraction of them, would run it slower.
    mig_transfer_share: float = 0.05


@dataclass(frozen=True, slots=True)
class Recommendation:
    """One fix: what to do, the GPU-seconds and USD it acts on, what it saves and why so."""

    kind: FixKind
    cause: str | None
    action: str
    seconds: float
    usd: float | None
    saving_fraction: float
    saving_usd: float | None
    assumption: str
    profile: str | None = None  # the MIG profile, for kind "mig"
    gpus: int | None = None  # the GPUs to ask for, for kind "fewer_gpus"
    # What ``saving_fraction`` is a share of, in words ("transfer_bound's $4.07, 1.02 GPU-h",
    # "the $2.04 the fixes above leave"): the percentage is on the base it names.
    base: str = ""

    def as_dict(self) -> dict[str, object]:
        """The API's form of the recommendation."""
        return asdict(self)  # every field, in their order


def fix_fraction(
    cause: Cause, a: FixAssumptions, usage: Integrals | None = None
) -> tuple[float, str]:
    """The share of a cause's time its fix saves, and the assumption that says so: from the
    group's own signals in ``usage`` where they tell (``service.costs.recoverable``), else
    the constant."""
    return cause_fix(cause, a, usage)[:2]


def cause_fix(
    cause: Cause, a: FixAssumptions, usage: Integrals | None = None
) -> tuple[float, str, str | None]:
    """``fix_fraction`` with the fix to name instead of the cause's usual one (None: the
    usual one), where the signals say that one is already applied."""
    fraction, why = constant_fraction(cause, a)
    if usage is None or cause not in RECOVERABLE_CAUSES:
        return fraction, why, None
    share = recoverable_share(
        cause, usage, a.gpu_model, (fraction, why), memory_speedup=a.memory_speedup,
        tensor_speedup=a.tensor_speedup, launch_min_util=a.launch_min_util,
        transfer_bytes_per_second=a.transfer_bytes_per_second,
    )  # fmt: skip
    return share.share, share.formula, share.action


RECOVERABLE_CAUSES = frozenset(
    (Cause.INPUT_STARVED, Cause.LAUNCH_BOUND, Cause.TRANSFER_BOUND, Cause.MEMORY_BOUND,
     Cause.COMPUTE_NO_TENSOR)
)  # fmt: skip


def constant_fraction(cause: Cause, a: FixAssumptions) -> tuple[float, str]:
    """The constant share of a cause's time its fix saves (the fallback where no signal
    tells), and the assumption that says so; a cause without its branch is an error."""
    match cause:
        case Cause.IDLE_EMPTY | Cause.IDLE_HELD:
            return 1.0, "nothing ran in this time: all of it is saved when the GPU is released"
        case Cause.SHAM:
            return 1.0, (
                "the kernels of this time did no useful work (no input read, no progress): "
                "all of it is saved when the GPU is released"
            )
        case Cause.HUNG:
            return 1.0, (
                "the job stopped advancing while its kernels stayed resident: all of this "
                "time is saved when the GPU is released"
            )
        case Cause.COMPUTE_NO_TENSOR:
            s = a.tensor_speedup
            return 1.0 - 1.0 / s, (
                f"tensor cores run this maths {s:g}x faster (setting fix_tensor_speedup; "
                f"{TENSOR_SPEEDUP_SOURCE})"
            )
        case Cause.MEMORY_BOUND:
            s = a.memory_speedup
            return 1.0 - 1.0 / s, (
                f"a DRAM-bound kernel's time follows the bytes it moves; fusion or bf16 instead "
                f"of fp32 moves 1/{s:g} of them (setting fix_memory_speedup)"
            )
        case Cause.INPUT_STARVED:
            return 1.0 - a.starved_util, (
                f"kernels ran under {a.starved_util:.0%} of this time (the rule that named it); "
                f"fed fully, the same kernels need at most that share"
            )
        case Cause.LAUNCH_BOUND:
            return 1.0 - a.launch_fill, (
                f"the SMs were under {a.launch_fill:.0%} full while kernels ran (the rule that "
                f"named it); in fewer, larger launches the same work needs at most that share"
            )
        case Cause.TRANSFER_BOUND:
            return 1.0 - a.busy, (
                f"the SMs were busy under {a.busy:.0%} of this time while copies ran (the rule "
                f"that named it); with copies overlapped or the data kept on the GPU the time "
                f"shrinks to at most that share"
            )
        case Cause.COMPUTE_TENSOR | Cause.UNCLASSIFIED:
            return 0.0, "healthy or not diagnosable: no fix"
        case _:
            assert_never(cause)


def with_model(a: FixAssumptions, models: Sequence[str]) -> FixAssumptions:
    """``a`` for GPUs of ``models``: their model where they share one (and ``a`` names none)."""
    if a.gpu_model is not None or len(set(models)) != 1:
        return a
    return replace(a, gpu_model=models[0])


def _per_second(summary: Summary) -> float | None:
    """The summary's mean USD per covered GPU-second, None if unpriced or empty."""
    cov = summary.usage.covered_seconds
    if not summary.priced or cov <= 0:
        return None
    return summary.cost_usd / cov


def cause_fixes(
    summary: Summary,
    a: FixAssumptions,
    *,
    taken_seconds: dict[Cause, float] | None = None,
    taken_usd: dict[Cause, float] | None = None,
) -> list[Recommendation]:
    """One recommendation per waste cause with time, on that cause's seconds and dollars less
    what another fix took (``taken_*``); largest saving first."""
    taken_seconds = taken_seconds or {}
    taken_usd = taken_usd or {}
    priced = summary.priced
    out: list[Recommendation] = []
    for cause, action in CAUSE_FIX.items():
        i = cause.column
        seconds = getattr(summary.usage, f"{CAUSE_NAMES[i]}_seconds") - taken_seconds.get(
            cause, 0.0
        )
        if seconds <= 1e-9:
            continue
        usd = max(summary.cause_cost_usd[i] - taken_usd.get(cause, 0.0), 0.0) if priced else None
        fraction, why, instead = cause_fix(cause, a, summary.usage)
        kind: FixKind = "cause"
        if instead:
            action = instead
        if summary.key == UNALLOCATED and cause in IDLE_CAUSES:
            # Time no job held is the pool's to give back: there is no job to end.
            kind, action = "pool", pool_action(cause, seconds, len(summary.gpu_ids))
        out.append(
            Recommendation(
                kind=kind,
                cause=cause.label,
                action=action,
                seconds=seconds,
                usd=usd,
                saving_fraction=fraction,
                saving_usd=None if usd is None else usd * fraction,
                assumption=why,
                base=f"{cause.label}'s {money_and_hours(usd, seconds)}",
            )
        )
    return sort_fixes(out)


def money_and_hours(usd: float | None, seconds: float) -> str:
    hours = f"{seconds / 3600:.2f} GPU-h"
    return hours if usd is None else f"${usd:,.2f} ({hours})"


def pool_action(cause: Cause, seconds: float, gpus: int) -> str:
    """What to do about GPU time no job held: the pool's capacity, with its GPU-hours."""
    where = f"{seconds / 3600:.2f} GPU-h on {gpus} GPU{'' if gpus == 1 else 's'}"
    if cause is Cause.IDLE_HELD:
        return (
            f"{where} held memory with no job running (a process outside any job): find and "
            f"end it, then release or shrink the idle capacity"
        )
    return (
        f"{where} sat idle with no job: release or shrink the idle capacity (scale the node "
        f"pool down, return reserved or cloud GPUs, or lend them to a queue)"
    )


def sort_fixes(fixes: list[Recommendation]) -> list[Recommendation]:
    """Largest saving in USD first (unpriced by saved seconds, after the priced ones)."""
    return sorted(
        fixes,
        key=lambda r: (
            r.saving_usd is None,
            -(r.saving_usd or 0.0),
            -r.seconds * r.saving_fraction,
        ),
    )


def total_saving_usd(fixes: Sequence[Recommendation]) -> float | None:
    """The USD all the fixes save together (they never share a second), None if unpriced."""
    if any(f.saving_usd is None for f in fixes):
        return None
    return sum(f.saving_usd or 0.0 for f in fixes)
