"""Recommendations: the fix of each cause, its saving, right-sizing, and savings counted once."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import pytest

from service.core.diagnosis import CAUSE_NAMES, WASTE_CAUSES
from service.costs.prices import PriceRow
from service.costs.recommend import FixAssumptions, cause_fixes, total_saving_usd
from service.costs.rightsizing import MIG_PROFILES, GpuUse, fit_mig, mig_family, recommend_job
from service.costs.waste import UNALLOCATED, Line, Summary, Usage

H200_BYTES = 150_754_820_096  # what the lent H200 reports (docs/gpu-check)
GIB = 1024**3
A = FixAssumptions()
# A GPU that moved little: DRAM a tenth busy, 1 GB/s over PCIe, nothing over NVLink.
QUIET: dict[str, float] = {
    "peak_dram_active": 0.1,
    "peak_pcie_bytes_per_second": 1e9,
    "peak_nvlink_bytes_per_second": 0.0,
}


def summary(price: float | None = 3.6, **seconds: float) -> Summary:
    """A one-GPU summary with the given seconds per cause (``activity`` sets unused time)."""
    activity = seconds.pop("activity", 0.0)
    usage = Usage()
    for name, value in seconds.items():
        setattr(usage, f"{name}_seconds", value)
    usage.covered_seconds = sum(seconds.values())
    usage.idle_seconds = usage.idle_empty_seconds + usage.idle_held_seconds
    running = usage.covered_seconds - usage.idle_seconds
    usage.unused_seconds = usage.idle_seconds + running * (1 - activity)
    s = Summary("job")
    s.add_line(Line("job", 1, usage.covered_seconds, usage, price))
    return s


def test_each_cause_gets_its_fix_and_saving() -> None:
    # $3.60/h = $0.001/s: 1000 s of a cause cost $1.00.
    want = {
        "idle_empty": 1.0,
        "idle_held": 1.0,
        "compute_no_tensor": 0.75,  # 4x faster on tensor cores
        "memory_bound": 0.5,
        "input_starved": 0.5,
        "launch_bound": 0.5,
        "transfer_bound": 0.5,
    }
    for cause, saving in want.items():
        fixes = cause_fixes(summary(**{cause: 1000.0}), A)
        assert [f.cause for f in fixes] == [cause]
        assert fixes[0].usd == pytest.approx(1.0)
        assert fixes[0].saving_usd == pytest.approx(saving)
        assert fixes[0].assumption
    assert cause_fixes(summary(compute_tensor=1000.0), A) == []
    assert cause_fixes(summary(unclassified=1000.0), A) == []


def test_the_tensor_speedup_is_a_setting() -> None:
    fixes = cause_fixes(summary(compute_no_tensor=1000.0), FixAssumptions(tensor_speedup=8.0))
    assert fixes[0].saving_usd == pytest.approx(0.875)
    assert "8x" in fixes[0].assumption and "datasheet" in fixes[0].assumption


def test_largest_saving_first_and_unpriced_has_no_dollars() -> None:
    fixes = cause_fixes(summary(launch_bound=1000.0, idle_held=600.0, compute_tensor=50.0), A)
    assert [f.cause for f in fixes] == ["idle_held", "launch_bound"]
    unpriced = cause_fixes(summary(None, launch_bound=1000.0), A)
    assert unpriced[0].saving_usd is None and unpriced[0].saving_fraction == 0.5
    assert total_saving_usd(unpriced) is None


def _random_summary(rng: random.Random, price: float | None) -> Summary:
    seconds = {name: rng.choice([0.0, rng.uniform(0, 5000)]) for name in CAUSE_NAMES}
    return summary(price, activity=rng.random(), **seconds)


def test_savings_never_exceed_the_cost_property() -> None:
    """Random jobs (1 to 8 GPUs, any mix of causes, memory and speed-ups): the savings of all
    fixes together never exceed the cost, and no fix saves more than the dollars it acts on."""
    rng = random.Random(16)
    for _ in range(2000):
        a = FixAssumptions(
            tensor_speedup=rng.uniform(1, 16),
            memory_speedup=rng.uniform(1, 4),
            starved_util=rng.random(),
            launch_fill=rng.random(),
            busy=rng.random(),
            idle_gpu_fraction=rng.uniform(0.05, 1),
        )
        gpus = []
        total = Summary("job")
        for i in range(rng.randint(1, 8)):
            s = _random_summary(rng, 3.6)
            total.merge(s)
            peak = rng.uniform(0, H200_BYTES)
            gpus.append(
                GpuUse(f"GPU-{i}", "NVIDIA H200", H200_BYTES, peak, s,
                       peak_dram_active=rng.random(), peak_pcie_bytes_per_second=rng.uniform(0, 4e10),
                       peak_nvlink_bytes_per_second=rng.choice([0.0, 4e10]))
            )  # fmt: skip
        fixes = recommend_job(total, gpus, a)
        saved = total_saving_usd(fixes)
        assert saved is not None
        assert saved <= total.cost_usd + 1e-9
        for f in fixes:
            assert f.saving_usd is not None and f.usd is not None
            assert 0 <= f.saving_usd <= f.usd + 1e-9
        # Each second goes to one fix at most: the seconds of the fixes that act on seconds
        # of their own (all but the slice, which prices what the others leave) fit the job.
        claimed = sum(f.seconds for f in fixes if f.kind != "mig")
        assert claimed <= total.usage.covered_seconds + 1e-6
        for cause in WASTE_CAUSES:
            assert (
                sum(f.seconds for f in fixes if f.cause == cause.label)
                <= getattr(total.usage, f"{cause.label}_seconds") + 1e-6
            )


def test_fewer_gpus_takes_the_idle_gpus_time_from_the_idle_fix() -> None:
    busy = [summary(compute_tensor=1000.0, activity=0.9) for _ in range(5)]
    idle = [summary(idle_held=850.0, compute_tensor=150.0, activity=0.9) for _ in range(3)]
    gpus = [
        GpuUse(f"GPU-{i}", "NVIDIA H100 80GB HBM3", 85.5e9, 60 * GIB, s, **QUIET)
        for i, s in enumerate(busy + idle)
    ]
    total = Summary("job")
    for g in gpus:
        total.merge(g.summary)
    fixes = recommend_job(total, gpus, A)
    fewer = [f for f in fixes if f.kind == "fewer_gpus"]
    assert len(fewer) == 1 and fewer[0].gpus == 5
    assert "3 of 8 GPUs idle 85%" in fewer[0].action and "ask for 5" in fewer[0].action
    assert fewer[0].saving_usd == pytest.approx(3 * 0.85)
    # The idle seconds of the 3 GPUs are all the job's idle seconds: no idle fix is left.
    assert not [f for f in fixes if f.cause == "idle_held"]
    assert not [f for f in fixes if f.kind == "mig"]  # not with GPUs to give back


def test_mig_profiles_of_each_model() -> None:
    assert mig_family("NVIDIA H200", H200_BYTES) == ("H200", 141)
    assert mig_family("NVIDIA H100 80GB HBM3", 85.5e9) == ("H100", 80)
    assert mig_family("NVIDIA H100 NVL", 100.5e9) == ("H100", 94)
    assert mig_family("NVIDIA A100-SXM4-40GB", 42.9e9) == ("A100", 40)
    assert mig_family("NVIDIA A100 80GB PCIe", None) == ("A100", 80)
    assert mig_family("NVIDIA H100 80GB HBM3 MIG 1g.10gb", None) is None  # already a slice
    assert mig_family("Tesla V100-SXM2-16GB", 16e9) is None
    names = [p.name for p in MIG_PROFILES[("H200", 141)]]
    assert names[:3] == ["1g.18gb", "1g.35gb", "2g.35gb"] and "3g.71gb" in names


@pytest.mark.parametrize(
    ("peak_gib", "activity", "profile"),
    [
        (1.8, 0.11, "1g.18gb"),  # the recorded input-starved loop
        (15.0, 0.10, "1g.18gb"),  # 15 GiB <= 0.9 x 17.5 GiB
        (16.0, 0.10, "1g.35gb"),  # over 90% of a 1g.18gb's memory
        (23.2, 0.0, "1g.35gb"),  # the recorded idle GPU holding 22 GiB
        (28.0, 0.25, "2g.35gb"),  # a fifth of the memory, activity over 1/7
        (28.0, 0.32, "3g.71gb"),  # over 2/7 of the SMs
        (60.0, 0.5, "4g.71gb"),
        (60.0, 0.6, None),  # more SM work than 4 of 7 slices hold
        (80.0, 0.1, None),  # more memory than half the GPU
    ],
)
def test_fit_mig_on_an_h200(peak_gib: float, activity: float, profile: str | None) -> None:
    s = summary(idle_held=1.0)
    gpu = GpuUse("GPU-0", "NVIDIA H200", H200_BYTES, peak_gib * GIB, s, **QUIET)
    fit = fit_mig(gpu, activity, A)
    assert (fit.name if fit else None) == profile


def test_a_job_using_a_fifth_of_an_h200_at_low_activity_is_offered_a_mig_slice() -> None:
    s = summary(launch_bound=900.0, compute_tensor=900.0, input_starved=900.0, idle_held=900.0)
    # Activity while running: tensor phase 0.96, the rest about 0 -> 0.32.
    s.usage.unused_seconds = 900 + 900 + 900 + 900 * 0.04
    gpu = GpuUse("GPU-0", "NVIDIA H200", H200_BYTES, 0.2 * H200_BYTES, s, **QUIET)
    prices = [PriceRow("*H200*", 3.6, datetime(2026, 1, 1, tzinfo=UTC))]
    fixes = recommend_job(s, [gpu], A, prices=prices, when=datetime(2026, 12, 3, tzinfo=UTC))
    mig = [f for f in fixes if f.kind == "mig"]
    # Activity 0.32 fits 3/7 of the SMs now; with the launch and input fixes the same work
    # runs in 2/3 of the time (0.48), which needs 4/7.
    assert len(mig) == 1 and mig[0].profile == "4g.71gb"
    assert fit_mig(gpu, 0.32, A) == MIG_PROFILES[("H200", 141)][3]  # 3g.71gb before the fixes
    # Cause fixes save 0.9 + 0.45 + 0.45 of $3.60; the slice saves 3/7 of the $1.80 left,
    # and its percentage says so.
    assert mig[0].saving_usd == pytest.approx(1.8 * 3 / 7)
    assert mig[0].base == "the $1.80 the fixes above leave"
    assert total_saving_usd(fixes) == pytest.approx(1.8 + 1.8 * 3 / 7)
    # A price naming the profile wins over the compute share.
    named = [*prices, PriceRow("*4g.71gb*", 0.9, datetime(2026, 1, 1, tzinfo=UTC))]
    fixes = recommend_job(s, [gpu], A, prices=named, when=datetime(2026, 12, 3, tzinfo=UTC))
    mig = [f for f in fixes if f.kind == "mig"]
    assert mig[0].saving_usd == pytest.approx(1.8 * 0.75)


def test_an_all_idle_job_is_told_to_release_not_to_take_a_slice() -> None:
    s = summary(idle_held=3600.0)
    gpu = GpuUse("GPU-0", "NVIDIA H200", H200_BYTES, 23.2 * GIB, s, **QUIET)
    fixes = recommend_job(s, [gpu], A)
    assert [f.kind for f in fixes] == ["cause"] and fixes[0].cause == "idle_held"
    assert fixes[0].saving_usd == pytest.approx(s.cost_usd)


H100 = ("NVIDIA H100 80GB HBM3", 85.5e9)


def _one_gpu(s: Summary, peak_gib: float, **peaks: float) -> GpuUse:
    return GpuUse("GPU-0", H100[0], H100[1], peak_gib * GIB, s, **{**QUIET, **peaks})


def test_a_copy_bound_job_is_never_offered_a_slice() -> None:
    """The demo's transfer-bound job: 3.4 GiB, SMs idle, 27 GB/s each way over PCIe. A 1g slice
    has 1/7 of the copy engines (9 GB/s of the link's 64): it would run slower."""
    s = summary(4.0, transfer_bound=3600.0)
    gpu = _one_gpu(s, 3.4, peak_dram_active=0.02, peak_pcie_bytes_per_second=27e9)
    fit = fit_mig(gpu, 0.0, A)
    assert fit is not None and fit.name == "4g.40gb"  # the smallest with the copy engines
    fixes = recommend_job(s, [gpu], A)
    assert [f.kind for f in fixes] == ["cause"] and fixes[0].cause == "transfer_bound"
    # Not even with the copy-bound share rule off: once the copy fix halves the time, the same
    # bytes move at 54 GB/s each way, more than the copy engines of any slice.
    loose = FixAssumptions(mig_transfer_share=1.01)
    assert not [f for f in recommend_job(s, [gpu], loose) if f.kind == "mig"]
    assert fit_mig(gpu, 0.0, A, speedup=2.0) is None


@pytest.mark.parametrize(
    ("peaks", "why"),
    [
        ({"peak_dram_active": 0.88}, "DRAM bandwidth of more than half the GPU's"),
        ({"peak_nvlink_bytes_per_second": 2e10}, "NVLink traffic: MIG has no P2P"),
        ({"peak_pcie_bytes_per_second": 40e9}, "more PCIe than 4/7 of the copy engines move"),
        ({"peak_dram_active": None}, "DRAM never reported: a fit is never assumed"),
        ({"peak_pcie_bytes_per_second": None}, "PCIe never reported"),
    ],
)
def test_a_slice_must_hold_dram_pcie_and_nvlink_too(peaks: dict[str, Any], why: str) -> None:
    s = summary(4.0, memory_bound=3600.0, activity=0.2)
    assert fit_mig(_one_gpu(s, 3.0), 0.2, A) is not None  # quiet, it fits a slice
    assert fit_mig(_one_gpu(s, 3.0, **peaks), 0.2, A) is None, why


def test_fewer_gpus_only_when_the_gpus_kept_can_take_the_work() -> None:
    busy = summary(compute_tensor=1000.0, activity=0.95)
    spare = summary(idle_held=850.0, compute_tensor=150.0, activity=0.95)
    model, total = H100
    gpus = [
        GpuUse("GPU-0", model, total, 60 * GIB, busy, **QUIET),
        GpuUse("GPU-1", model, total, 60 * GIB, spare, **QUIET),
    ]
    job = Summary("job")
    for g in gpus:
        job.merge(g.summary)
    # 0.95 + 0.14 GPU of SM work does not fit one GPU: no GPU is given back.
    assert not [f for f in recommend_job(job, gpus, A) if f.kind == "fewer_gpus"]
    light = summary(compute_tensor=1000.0, activity=0.5)
    gpus[0] = GpuUse("GPU-0", model, total, 60 * GIB, light, **QUIET)
    job = Summary("job")
    for g in gpus:
        job.merge(g.summary)
    fewer = [f for f in recommend_job(job, gpus, A) if f.kind == "fewer_gpus"]
    assert [f.gpus for f in fewer] == [1]
    assert fewer[0].base.startswith("the idle time of the 1 GPUs given back")
    # A GPU that talks to its peers over NVLink is a rank of the job, not a spare.
    ranks = [gpus[0], GpuUse("GPU-1", model, total, 60 * GIB, spare,
                             **{**QUIET, "peak_nvlink_bytes_per_second": 3e10})]  # fmt: skip
    assert not [f for f in recommend_job(job, ranks, A) if f.kind == "fewer_gpus"]
    # Both GPUs' PCIe rates must fit the link of the one kept.
    busy_links = [GpuUse(g.uuid, model, total, 60 * GIB, g.summary,
                         **{**QUIET, "peak_pcie_bytes_per_second": 40e9}) for g in gpus]  # fmt: skip
    assert not [f for f in recommend_job(job, busy_links, A) if f.kind == "fewer_gpus"]


def test_unallocated_time_gets_pool_advice_with_its_gpu_hours() -> None:
    usage = Usage(covered_seconds=7200.0, idle_seconds=7200.0, unused_seconds=7200.0,
                  idle_empty_seconds=7200.0)  # fmt: skip
    pool = Summary(UNALLOCATED)
    pool.add_line(Line(None, 1, 3600.0, usage, 4.0))
    fixes = cause_fixes(pool, A)
    assert [(f.kind, f.cause) for f in fixes] == [("pool", "idle_empty")]
    assert "2.00 GPU-h on 1 GPU sat idle with no job" in fixes[0].action
    assert "release or shrink the idle capacity" in fixes[0].action
    assert "end the job" not in fixes[0].action
    assert fixes[0].saving_usd == pytest.approx(pool.cost_usd)
    # A job's idle time is still the job's to release.
    job = cause_fixes(summary(idle_empty=7200.0), A)
    assert job[0].kind == "cause" and "end the job" in job[0].action


def test_each_percentage_names_its_base() -> None:
    fixes = cause_fixes(summary(4.0, transfer_bound=3600.0), A)
    assert fixes[0].base == "transfer_bound's $4.00 (1.00 GPU-h)"
