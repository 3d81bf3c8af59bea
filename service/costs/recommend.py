"""What to do about a job's waste and what it would save (USD), with the assumption behind each.

Pure: a job's (or a report group's) summary in, recommendations out. Every covered second has
one cause and each cause one fix, so a cause's dollars go to its fix only; asking for fewer GPUs
takes the idle seconds of the GPUs it gives back away from the idle fixes, and a smaller MIG
slice is priced on what the other fixes leave. The savings of a job therefore add up to at most
its cost, whichever of them it acts on.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal, assert_never

from service.core.diagnosis import CAUSE_FIX, CAUSE_NAMES, IDLE_CAUSES, Cause
from service.costs.integrals import Integrals
from service.costs.prices import PriceRow, mig_share, price_at
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
        return {
            "kind": self.kind,
            "cause": self.cause,
            "action": self.action,
            "seconds": self.seconds,
            "usd": self.usd,
            "saving_fraction": self.saving_fraction,
            "saving_usd": self.saving_usd,
            "assumption": self.assumption,
            "profile": self.profile,
            "gpus": self.gpus,
            "base": self.base,
        }


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


_IDLE_NAMES = frozenset(c.label for c in IDLE_CAUSES)
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
                base=f"{cause.label}'s {_money_and_hours(usd, seconds)}",
            )
        )
    return sort_fixes(out)


def _money_and_hours(usd: float | None, seconds: float) -> str:
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


# --- right-sizing -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A MIG GPU-instance profile: its compute slices (of 7) and memory in eighths."""

    name: str
    compute_slices: int
    memory_eighths: int


def _profiles(*spec: tuple[str, int, int]) -> tuple[MigProfile, ...]:
    return tuple(MigProfile(n, c, m) for n, c, m in spec)


# NVIDIA MIG User Guide, "Supported MIG Profiles" (docs.nvidia.com/datacenter/tesla/
# mig-user-guide): each profile's fraction of SMs (n/7) and of memory (n/8). Whole GPUs
# (7g) are left out: they are no smaller allocation. Keyed by (family, memory class in GB).
MIG_PROFILES: dict[tuple[str, int], tuple[MigProfile, ...]] = {
    ("A100", 40): _profiles(
        ("1g.5gb", 1, 1), ("1g.10gb", 1, 2), ("2g.10gb", 2, 2), ("3g.20gb", 3, 4), ("4g.20gb", 4, 4)
    ),
    ("A100", 80): _profiles(
        ("1g.10gb", 1, 1),
        ("1g.20gb", 1, 2),
        ("2g.20gb", 2, 2),
        ("3g.40gb", 3, 4),
        ("4g.40gb", 4, 4),
    ),
    ("H100", 80): _profiles(
        ("1g.10gb", 1, 1),
        ("1g.20gb", 1, 2),
        ("2g.20gb", 2, 2),
        ("3g.40gb", 3, 4),
        ("4g.40gb", 4, 4),
    ),
    ("H100", 94): _profiles(
        ("1g.12gb", 1, 1),
        ("1g.24gb", 1, 2),
        ("2g.24gb", 2, 2),
        ("3g.47gb", 3, 4),
        ("4g.47gb", 4, 4),
    ),
    ("H200", 141): _profiles(
        ("1g.18gb", 1, 1),
        ("1g.35gb", 1, 2),
        ("2g.35gb", 2, 2),
        ("3g.71gb", 3, 4),
        ("4g.71gb", 4, 4),
    ),
}
_FAMILY = re.compile(r"\b(A100|H100|H200)\b", re.IGNORECASE)
_GB_IN_NAME = re.compile(r"(\d+)\s*GB", re.IGNORECASE)


def mig_family(model: str, fb_total_bytes: float | None) -> tuple[str, int] | None:
    """The MIG_PROFILES key of a whole GPU's model (memory class from its size or its name)."""
    m = _FAMILY.search(model)
    if m is None or mig_share(model) is not None:
        return None
    family = m.group(1).upper()
    classes = sorted(gb for fam, gb in MIG_PROFILES if fam == family)
    if fb_total_bytes:
        gb = fb_total_bytes / 1e9
    else:
        named = _GB_IN_NAME.search(model)
        gb = float(named.group(1)) if named else float(classes[0])
    # The class nearest the size (an 80 GB H100 reports 85.5e9 bytes, the 94 GB one 100.5e9).
    best = min(classes, key=lambda c: abs(c - gb))
    return family, best


# Host link bandwidth of each family, bytes per second each way (NVIDIA datasheets: A100 PCIe
# Gen4 64 GB/s, H100 and H200 PCIe Gen5 128 GB/s, both directions together). A MIG slice has
# n/7 of the copy engines (the MIG User Guide's profile tables: 1g one, 2g two, ... 7g seven),
# so it moves at most that share of it.
PCIE_BYTES_PER_SECOND: dict[str, float] = {"A100": 32e9, "H100": 64e9, "H200": 64e9}


@dataclass(frozen=True, slots=True)
class GpuUse:
    """One GPU of a job: its summary, model, memory size, and what a smaller allocation must
    hold: the job's peak memory on it (bytes), its busiest minute's DRAM activity (ratio) and
    PCIe and NVLink rates (bytes/s, the busier direction); None where it never reported it."""

    uuid: str
    model: str
    fb_total_bytes: float | None
    peak_fb_used_bytes: float | None
    summary: Summary
    peak_dram_active: float | None = None
    peak_pcie_bytes_per_second: float | None = None
    peak_nvlink_bytes_per_second: float | None = None

    def talks_to_peers(self, a: FixAssumptions) -> bool:
        """Whether the GPU moved data over NVLink (a rank of a collective, a P2P pipeline)."""
        nv = self.peak_nvlink_bytes_per_second
        return nv is not None and nv >= a.nvlink_min_bytes_per_second


def busy_activity(summary: Summary) -> float:
    """The mean activity (ratio) over the time something ran: the SM work per second that a
    smaller allocation must hold."""
    u = summary.usage
    running = u.covered_seconds - u.idle_seconds
    if running <= 0:
        return 0.0
    return max(0.0, min(1.0, (u.covered_seconds - u.unused_seconds) / running))


def fit_mig(
    gpu: GpuUse, activity: float, a: FixAssumptions, *, speedup: float = 1.0
) -> MigProfile | None:
    """The smallest MIG profile of the GPU's model that holds all the job did on it: its peak
    memory (with headroom), its SM work while running (``activity``), its busiest minute's
    DRAM bandwidth (the slice's share of memory) and PCIe rate (its share of the copy
    engines, with headroom), and no NVLink traffic (MIG has no GPU-to-GPU P2P); None if none
    does, or if a figure it needs was never reported (a fit is never assumed). ``speedup``
    (how many times faster the other fixes make the job run) scales the rates: the same work
    and bytes in less time."""
    key = mig_family(gpu.model, gpu.fb_total_bytes)
    if (
        key is None
        or gpu.peak_fb_used_bytes is None
        or gpu.peak_dram_active is None
        or gpu.peak_pcie_bytes_per_second is None
        or gpu.talks_to_peers(a)
    ):
        return None
    total = gpu.fb_total_bytes or key[1] * 1e9
    link = PCIE_BYTES_PER_SECOND[key[0]]
    for profile in sorted(MIG_PROFILES[key], key=lambda p: (p.compute_slices, p.memory_eighths)):
        memory_share = profile.memory_eighths / 8
        sm_share = profile.compute_slices / 7  # of the SMs, and of the copy engines
        if (
            gpu.peak_fb_used_bytes <= a.mig_memory_headroom * total * memory_share
            and activity * speedup <= sm_share
            and gpu.peak_dram_active * speedup <= memory_share
            and gpu.peak_pcie_bytes_per_second * speedup <= a.mig_memory_headroom * link * sm_share
        ):
            return profile
    return None


def fixes_speedup(summary: Summary, fixes: Sequence[Recommendation]) -> float:
    """How many times faster the job's running time gets with ``fixes`` applied: its running
    seconds over those the cause fixes of running causes leave (idle fixes remove no work)."""
    u = summary.usage
    running = u.covered_seconds - u.idle_seconds
    saved = sum(
        f.seconds * f.saving_fraction
        for f in fixes
        if f.kind == "cause" and f.cause not in _IDLE_NAMES
    )
    if running <= 0:
        return 1.0
    return running / max(running - saved, 1e-9 * running)


def copy_bound(summary: Summary, a: FixAssumptions) -> bool:
    """Whether copies are the job's bottleneck for ``mig_transfer_share`` of its running time."""
    u = summary.usage
    running = u.covered_seconds - u.idle_seconds
    return running > 0 and u.transfer_bound_seconds >= a.mig_transfer_share * running


def _slice_ratio(
    prices: Sequence[PriceRow], model: str, profile: MigProfile, when: datetime
) -> float:
    """The slice's price as a share of the whole GPU's (a price naming the profile, else its
    compute share)."""
    whole = price_at(prices, model, when)
    part = price_at(prices, f"{model} MIG {profile.name}", when)
    if whole is None or part is None or whole.usd_per_gpu_hour <= 0:
        return profile.compute_slices / 7
    return min(part.usd_per_gpu_hour / whole.usd_per_gpu_hour, 1.0)


def _gib(n: float) -> str:
    return f"{n / 1024**3:.1f} GiB"


MIG_MIN_LEFT = 0.05  # a slice is offered when the other fixes leave this share of the cost


def _spare_gpus(gpus: Sequence[GpuUse], a: FixAssumptions) -> list[GpuUse]:
    """The GPUs the job could give back: idle ``idle_gpu_fraction`` of their time or more and
    not talking to their peers over NVLink, when the GPUs kept can take the rest of their work
    (SM work within the kept GPUs' time, every GPU's busiest PCIe rate within the kept GPUs'
    links); none otherwise."""
    spare = [g for g in gpus if _idle_alone(g, a)]
    if len(gpus) < 2 or not spare or len(spare) == len(gpus):
        return []
    kept = [g for g in gpus if g not in spare]
    work = sum(g.summary.usage.covered_seconds - g.summary.usage.unused_seconds for g in gpus)
    if work > sum(g.summary.usage.covered_seconds for g in kept):
        return []
    if not _links_take_copies(gpus, kept, a):
        return []
    return spare


def _idle_alone(gpu: GpuUse, a: FixAssumptions) -> bool:
    """Whether ``gpu`` sat idle ``idle_gpu_fraction`` of its covered seconds or more and moved
    no data over NVLink."""
    u = gpu.summary.usage
    return (
        u.covered_seconds > 0
        and u.idle_seconds >= a.idle_gpu_fraction * u.covered_seconds
        and not gpu.talks_to_peers(a)
    )


def _links_take_copies(gpus: Sequence[GpuUse], kept: Sequence[GpuUse], a: FixAssumptions) -> bool:
    """Whether the kept GPUs' host links (with headroom) carry every GPU's busiest PCIe rate
    (bytes/s) together; True for a family whose link speed is not known, False where a GPU
    never reported its rate."""
    family = mig_family(kept[0].model, kept[0].fb_total_bytes)
    link = PCIE_BYTES_PER_SECOND.get(family[0]) if family else None
    if link is None:
        return True
    pcie = [g.peak_pcie_bytes_per_second for g in gpus]
    if any(p is None for p in pcie):
        return False
    # "Not over" rather than "<=": a NaN sum (false either way) does not stop the give-back.
    return not sum(p or 0.0 for p in pcie) > a.mig_memory_headroom * link * len(kept)


def _fewer_gpus(
    gpus: Sequence[GpuUse],
    spare: list[GpuUse],
    priced: bool,
    taken_seconds: dict[Cause, float],
    taken_usd: dict[Cause, float],
) -> Recommendation:
    """Give the spare GPUs back: their idle seconds and dollars, taken from the idle fixes."""
    seconds = usd = 0.0
    for g in spare:
        for cause in IDLE_CAUSES:
            sec = getattr(g.summary.usage, f"{cause.label}_seconds")
            d = g.summary.cause_cost_usd[cause.column] if g.summary.priced else 0.0
            taken_seconds[cause] = taken_seconds.get(cause, 0.0) + sec
            taken_usd[cause] = taken_usd.get(cause, 0.0) + d
            seconds += sec
            usd += d
    keep = len(gpus) - len(spare)
    least = min(g.summary.usage.idle_seconds / g.summary.usage.covered_seconds for g in spare)
    return Recommendation(
        kind="fewer_gpus",
        cause=None,
        action=f"{len(spare)} of {len(gpus)} GPUs idle {least:.0%} of the time or more while "
        f"the others worked: ask for {keep}",
        seconds=seconds,
        usd=usd if priced else None,
        saving_fraction=1.0,
        saving_usd=usd if priced else None,
        assumption="the idle time of the GPUs given back is saved; their little work moves to "
        "the GPUs kept, which have the SM time and PCIe bandwidth for it (no saving counted on "
        "it); none of the GPUs given back moved data over NVLink, and each rank's memory stays "
        "what it was",
        gpus=keep,
        base=f"the idle time of the {len(spare)} GPUs given back, "
        + _money_and_hours(usd if priced else None, seconds),
    )


def _mig(
    total: Summary,
    gpus: Sequence[GpuUse],
    fixes: list[Recommendation],
    a: FixAssumptions,
    prices: Sequence[PriceRow],
    when: datetime | None,
) -> Recommendation | None:
    """A MIG slice every GPU of the job fits, priced on the dollars the other fixes leave;
    None if none fits, copies are the job's bottleneck, or the fixes leave almost nothing."""
    if copy_bound(total, a):
        return None
    activity = busy_activity(total)
    # The slice is priced on what the fixes leave, so it must hold the job as they leave it:
    # the same work and bytes in less time.
    speedup = fixes_speedup(total, fixes)
    first = _common_fit(gpus, activity, a, speedup)
    if first is None:
        return None
    model = gpus[0].model
    ratio = (
        _slice_ratio(prices, model, first, when) if when is not None else first.compute_slices / 7
    )
    saved = sum(r.saving_usd or 0.0 for r in fixes)
    # The covered dollars: time without samples or on a lost GPU runs on no slice.
    covered_usd = sum(total.cause_cost_usd)
    left = max(covered_usd - saved, 0.0) if total.priced else None
    # A job all idle is told to release the GPU; a slice of the few cents left is noise.
    if left is not None and left < MIG_MIN_LEFT * covered_usd:
        return None
    return Recommendation(
        kind="mig",
        cause=None,
        action=_mig_action(gpus, first, activity),
        seconds=total.usage.covered_seconds,
        usd=left,
        saving_fraction=1.0 - ratio,
        saving_usd=None if left is None else left * (1.0 - ratio),
        assumption=_mig_assumption(first, a, ratio=ratio, activity=activity, speedup=speedup),
        profile=first.name,
        base="what the fixes above leave"
        if left is None
        else f"the ${left:,.2f} the fixes above leave",
    )


def _common_fit(
    gpus: Sequence[GpuUse], activity: float, a: FixAssumptions, speedup: float
) -> MigProfile | None:
    """The MIG profile ``fit_mig`` finds for every GPU of the job alike, None where one GPU
    fits none or the GPUs fit different ones."""
    fits = [fit_mig(g, activity, a, speedup=speedup) for g in gpus]
    first = fits[0]
    if first is None or not all(f is not None and f.name == first.name for f in fits):
        return None
    return first


def _mig_action(gpus: Sequence[GpuUse], profile: MigProfile, activity: float) -> str:
    """The MIG fix's action: the slice, with the busiest figures (over the job's GPUs) it holds."""
    peak = max(g.peak_fb_used_bytes or 0.0 for g in gpus)
    pcie = max(g.peak_pcie_bytes_per_second or 0.0 for g in gpus)
    dram = max(g.peak_dram_active or 0.0 for g in gpus)
    per_gpu_total = gpus[0].fb_total_bytes
    return (
        f"run on a MIG {profile.name} slice instead of a whole {gpus[0].model}: peak memory "
        f"{_gib(peak)}"
        + (f" of {_gib(per_gpu_total)}" if per_gpu_total else "")
        + f", activity while running {activity:.2f}, busiest minute's DRAM {dram:.2f} and PCIe "
        f"{pcie / 1e9:.1f} GB/s, no NVLink traffic"
    )


def _mig_assumption(
    profile: MigProfile, a: FixAssumptions, *, ratio: float, activity: float, speedup: float
) -> str:
    """The MIG fix's assumption: the slice's price ``ratio`` of the GPU and what its shares hold
    at ``speedup`` times today's rates."""
    n, m = profile.compute_slices, profile.memory_eighths
    return (
        f"the slice costs {ratio:.3g} of the GPU (its compute share unless a price "
        f"names the profile); its {n}/7 of the SMs hold the job's SM work while running "
        f"({activity:.2f}), its {m}/8 of the memory the peak with "
        f"{1 - a.mig_memory_headroom:.0%} spare and the busiest minute's DRAM bandwidth, its "
        f"{n}/7 of the copy engines the busiest minute's PCIe rate with the same spare, all "
        f"{speedup:.2g}x as fast as now once the fixes above run it in less time; MIG has no "
        f"NVLink; priced on the dollars the other fixes leave"
    )


def recommend_job(
    total: Summary,
    gpus: Sequence[GpuUse],
    a: FixAssumptions,
    *,
    prices: Sequence[PriceRow] = (),
    when: datetime | None = None,
) -> list[Recommendation]:
    """A job's fixes: fewer GPUs when some sat idle while others worked (and the others can
    take their work), a fix per waste cause, and a MIG slice that holds everything the job
    did; largest saving first, each second's dollars counted once."""
    out: list[Recommendation] = []
    taken_seconds: dict[Cause, float] = {}
    taken_usd: dict[Cause, float] = {}
    a = with_model(a, [g.model for g in gpus])
    spare = _spare_gpus(gpus, a)
    if spare:
        out.append(_fewer_gpus(gpus, spare, total.priced, taken_seconds, taken_usd))
    out += cause_fixes(total, a, taken_seconds=taken_seconds, taken_usd=taken_usd)
    if not spare and gpus:
        mig = _mig(total, gpus, out, a, prices, when)
        if mig is not None:
            out.append(mig)
    return sort_fixes(out)


def total_saving_usd(fixes: Sequence[Recommendation]) -> float | None:
    """The USD all the fixes save together (they never share a second), None if unpriced."""
    if any(f.saving_usd is None for f in fixes):
        return None
    return sum(f.saving_usd or 0.0 for f in fixes)
