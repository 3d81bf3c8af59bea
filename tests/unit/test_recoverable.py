"""Recoverable shares from a group's own signals: each formula, what is already applied, the
constant where a signal is missing, and (on random groups) shares in [0, 1] with waste equal to
the sum of the fixes' savings."""

from __future__ import annotations

import random

import pytest

from service.core.diagnosis import WASTE_CAUSES, Cause
from service.costs.integrals import CAUSE_SIGNALS, Integrals
from service.costs.recommend import (
    FixAssumptions,
    cause_fixes,
    constant_fraction,
    fix_fraction,
    total_saving_usd,
)
from service.costs.recoverable import (
    GPU_PEAKS,
    TARGETS,
    mean_signal,
    pcie_bytes_per_second,
    peaks_of,
    recoverable_share,
)
from service.costs.waste import Line, Summary, Usage

H200 = "NVIDIA H200"
A = FixAssumptions(gpu_model=H200)
FIELD = {s.cause: s.field for s in CAUSE_SIGNALS}


def usage_of(cause: Cause, seconds: float, mean: float | None) -> Usage:
    """``seconds`` of ``cause`` whose signal averaged ``mean`` (None: not stored)."""
    u = Usage()
    setattr(u, f"{cause.label}_seconds", seconds)
    u.covered_seconds = seconds
    if mean is not None:
        setattr(u, FIELD[cause], mean * seconds)
    return u


def share(cause: Cause, mean: float | None, model: str | None = H200) -> tuple[float, str, bool]:
    s = recoverable_share(cause, usage_of(cause, 100.0, mean), model, constant_fraction(cause, A))
    return s.share, s.formula, s.fallback


def test_the_models_of_the_fleet_have_peaks_and_specific_names_win() -> None:
    assert peaks_of("NVIDIA H200") is GPU_PEAKS[1]
    assert peaks_of("NVIDIA H100 PCIe") is not peaks_of("NVIDIA H100 80GB HBM3")
    assert peaks_of("NVIDIA H100 80GB HBM3") is not None
    assert peaks_of("NVIDIA L4") is not peaks_of("NVIDIA L40S")
    assert peaks_of("Tesla T4") is None and peaks_of(None) is None
    # PCI-SIG: Gen5 x16 carries 32 GT/s x 16 lanes x 128/130 one way.
    assert pcie_bytes_per_second(5, 16) == pytest.approx(2 * pcie_bytes_per_second(4, 16))
    assert pcie_bytes_per_second(5, 16) / 1e9 == pytest.approx(32 * 16 * 128 / 130 / 8)


def test_a_starved_loop_recovers_what_its_duty_cycle_leaves() -> None:
    low, _, fb = share(Cause.INPUT_STARVED, 0.08)
    high, formula, _ = share(Cause.INPUT_STARVED, 0.4)
    assert not fb and 0.0 < high < low < 1.0
    assert low == pytest.approx(1 - 0.08 / TARGETS.fed_duty)
    assert "duty 0.400" in formula and f"{TARGETS.fed_duty:.3f}" in formula


def test_tiny_kernels_already_back_to_back_are_told_to_fuse_not_to_use_graphs() -> None:
    eager = recoverable_share(
        Cause.LAUNCH_BOUND, usage_of(Cause.LAUNCH_BOUND, 100.0, 0.29), H200, (0.5, "c")
    )
    assert eager.action is None and eager.share > 0.5 and "CUDA graph" in eager.formula
    busy = recoverable_share(
        Cause.LAUNCH_BOUND, usage_of(Cause.LAUNCH_BOUND, 100.0, 0.96), H200, (0.5, "c")
    )
    assert busy.share == 0.0 and not busy.fallback
    assert busy.action is not None and "fuse" in busy.action and "graph" not in busy.action
    fixes = cause_fixes(_summary(usage_of(Cause.LAUNCH_BOUND, 100.0, 0.96)), A)
    assert fixes[0].action == busy.action and fixes[0].saving_usd == 0.0


def test_copies_at_the_links_peak_are_told_to_move_fewer_bytes_not_to_pin() -> None:
    link = pcie_bytes_per_second(5, 16) * TARGETS.pcie_practical_share
    pageable, formula, _ = share(Cause.TRANSFER_BOUND, 0.14 * link)
    assert pageable == pytest.approx(0.86) and "GB/s" in formula
    fixes = cause_fixes(_summary(usage_of(Cause.TRANSFER_BOUND, 100.0, 0.99 * link)), A)
    assert fixes[0].saving_usd == 0.0
    assert fixes[0].action.startswith("move fewer bytes") and "pinned" not in fixes[0].action
    # On a Gen4 GPU the same rate is a larger share of its link.
    a100, _, _ = share(Cause.TRANSFER_BOUND, 0.14 * link, "NVIDIA A100-SXM4-80GB")
    assert a100 < pageable


def test_fp32_maths_recovers_its_busy_part_at_the_models_tensor_ratio() -> None:
    h200, formula, fb = share(Cause.COMPUTE_NO_TENSOR, 0.955)
    l4, _, _ = share(Cause.COMPUTE_NO_TENSOR, 0.955, "NVIDIA L4")
    half, _, _ = share(Cause.COMPUTE_NO_TENSOR, 0.5)
    assert not fb and l4 < h200 < 0.955 and half < h200
    assert h200 <= 1 - 1 / peaks_of(H200).tensor_ratio  # type: ignore[union-attr]
    assert "989" in formula and "67" in formula


def test_memory_bound_time_recovers_only_what_fewer_bytes_save() -> None:
    full, _, _ = share(Cause.MEMORY_BOUND, 0.875)
    part, _, _ = share(Cause.MEMORY_BOUND, 0.6)
    assert full == pytest.approx(1 - 1 / A.memory_speedup)  # at DRAM's practical peak
    assert part < full


@pytest.mark.parametrize("cause", [s.cause for s in CAUSE_SIGNALS])
def test_a_missing_signal_keeps_the_constant_and_says_so(cause: Cause) -> None:
    for mean, model in ((0.0, H200), (None, H200)):
        value, formula, fb = share(cause, mean, model)
        assert fb and value == constant_fraction(cause, A)[0] and "(constant:" in formula
    if cause in (Cause.COMPUTE_NO_TENSOR, Cause.TRANSFER_BOUND):
        signal = 0.9 if cause is Cause.COMPUTE_NO_TENSOR else 3e10
        value, formula, fb = share(cause, signal, "Tesla T4")
        assert fb and "Tesla T4" in formula


def _summary(usage: Usage, price: float = 3.6) -> Summary:
    s = Summary("job")
    s.add_line(Line("job", 1, usage.covered_seconds, usage, price))
    return s


def _random_usage(rng: random.Random) -> Usage:
    u = Usage()
    for cause in (*WASTE_CAUSES, Cause.COMPUTE_TENSOR):
        if rng.random() < 0.3:
            continue
        seconds = rng.uniform(0.0, 3600.0)
        setattr(u, f"{cause.label}_seconds", seconds)
        u.covered_seconds += seconds
        field = FIELD.get(cause)
        if field is not None and rng.random() < 0.8:
            top = 8e10 if cause is Cause.TRANSFER_BOUND else 1.0
            setattr(u, field, seconds * rng.uniform(0.0, top))
    u.idle_seconds = u.idle_empty_seconds + u.idle_held_seconds
    u.unused_seconds = u.idle_seconds
    return u


def test_on_random_groups_shares_stay_in_range_and_waste_is_the_fixes_savings() -> None:
    rng = random.Random(25)
    models = [H200, "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-40GB", "NVIDIA L4", "Tesla T4", None]
    for _ in range(2000):
        usage = _random_usage(rng)
        a = FixAssumptions(gpu_model=rng.choice(models), memory_speedup=rng.uniform(1.0, 4.0))
        summary = _summary(usage, price=rng.uniform(0.5, 12.0))
        fixes = cause_fixes(summary, a)
        waste = 0.0
        for cause in WASTE_CAUSES:
            fraction, why = fix_fraction(cause, a, usage)
            assert 0.0 <= fraction <= 1.0 and why, (cause, fraction)
            waste += summary.cause_cost_usd[cause.column] * fraction
        total = total_saving_usd(fixes)
        assert total is not None
        assert total == pytest.approx(waste, rel=1e-9, abs=1e-12)
        for f in fixes:
            cause = Cause[str(f.cause).upper()]
            assert f.saving_usd is not None and f.usd is not None
            assert f.saving_usd <= f.usd + 1e-12  # never above the cause's dollars
            m = mean_signal(usage, cause)
            peaks = peaks_of(a.gpu_model)
            if cause is Cause.COMPUTE_NO_TENSOR and peaks is not None and m:
                assert f.saving_fraction <= 1 - 1 / peaks.tensor_ratio + 1e-12
        assert total <= summary.cost_usd + 1e-9


def test_without_the_groups_signals_the_fraction_is_the_constant() -> None:
    for cause in WASTE_CAUSES:
        assert fix_fraction(cause, A) == constant_fraction(cause, A)


def test_integrals_add_their_signals() -> None:
    a, b = Integrals(), Integrals()
    a.transfer_bound_pcie_bytes, b.transfer_bound_pcie_bytes = 1e9, 2e9
    a.add(b, 0.5)
    assert a.transfer_bound_pcie_bytes == pytest.approx(2e9)
