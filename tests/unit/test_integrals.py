"""The per-GPU integrals of the waste model: coverage, max_gap cutting, idle and held time."""

from __future__ import annotations

from typing import Any

import pytest

from service.costs.integrals import ActivityPoint, Thresholds, integrate
from tests.oracles import point_of

GIB = 1024**3
T = Thresholds(max_gap_seconds=60, idle=0.05, held_bytes=GIB)


def every_10s(start: float, end: float, **values: float | None) -> list[ActivityPoint]:
    return [point_of(float(t), values, T) for t in range(int(start), int(end), 10)]


def at(ts: float, **values: float | None) -> ActivityPoint:
    return point_of(ts, values, T)


def test_worked_example_hour_half_idle_held_half_at_0_8():
    points = every_10s(0, 1800, sm_active=0.0, fb_used_bytes=20 * GIB)
    points += every_10s(1800, 3600, sm_active=0.8, fb_used_bytes=20 * GIB)
    out = integrate(points, 0, 3600, T)
    assert out.covered_seconds == pytest.approx(3600)
    assert out.idle_seconds == pytest.approx(1800)
    assert out.idle_held_seconds == pytest.approx(1800)
    assert out.unused_seconds == pytest.approx(0.6 * 3600)


def test_gap_longer_than_max_gap_is_nodata_not_idle():
    points = [at(0, sm_active=0.0), at(300, sm_active=0.0)]
    out = integrate(points, 0, 400, T)
    # each sample covers at most 60 s; 300 s - 60 s in between is nodata
    assert out.covered_seconds == pytest.approx(120)
    assert out.idle_seconds == pytest.approx(120)


def test_window_cuts_intervals_at_both_edges():
    points = every_10s(0, 120, sm_active=0.5)
    out = integrate(points, 25, 65, T)
    assert out.covered_seconds == pytest.approx(40)
    assert out.unused_seconds == pytest.approx(20)


def test_missing_activity_is_nodata_and_gpu_util_is_a_flagged_fallback():
    points = [at(0), at(10, gpu_util=1.0), at(20, sm_active=0.5)]
    out = integrate(points, 0, 30, T)
    assert out.covered_seconds == pytest.approx(20)
    assert out.fallback_seconds == pytest.approx(10)
    assert out.unused_seconds == pytest.approx(5)


def test_idle_without_memory_is_not_idle_held_and_energy_integrates_power():
    points = every_10s(0, 60, sm_active=0.01, fb_used_bytes=GIB // 2, power_watts=100.0)
    out = integrate(points, 0, 60, T)
    assert out.idle_seconds == pytest.approx(60)
    assert out.idle_held_seconds == 0
    assert out.energy_used_joules == pytest.approx(6000)


def test_idle_is_nothing_running_and_every_covered_second_has_one_cause():
    # Tiny kernels (launch-bound) and a starved loop are not idle, though sm_active < 0.05.
    points = every_10s(0, 60, sm_active=0.03, gpu_util=0.33, tensor_active=0.0)
    points += every_10s(60, 120, sm_active=0.03, gpu_util=0.045, tensor_active=0.0)
    points += every_10s(120, 180, sm_active=0.0, gpu_util=0.0, fb_used_bytes=2 * GIB)
    points += every_10s(180, 240, sm_active=0.9, gpu_util=1.0, tensor_active=0.8)
    out = integrate(points, 0, 240, T)
    assert out.idle_seconds == pytest.approx(60)
    assert out.idle_held_seconds == pytest.approx(60)
    assert out.launch_bound_seconds == pytest.approx(60)
    assert out.input_starved_seconds == pytest.approx(60)
    assert out.compute_tensor_seconds == pytest.approx(60)
    assert sum(out.cause_seconds().values()) == pytest.approx(out.covered_seconds)


def test_the_worked_example_of_docs_diagnosis():
    from service.costs.waste import Line, Summary, Usage

    def second(ts: float, **values: float) -> ActivityPoint:
        return point_of(ts, values, Thresholds(max_gap_seconds=60))

    points = [
        second(t, sm_active=0.0003, gr_engine_active=0.29, gpu_util=0.3, fb_used_bytes=1.2 * GIB)
        for t in range(0, 1200)
    ]
    points += [
        second(t, sm_active=0.96, gr_engine_active=1.0, gpu_util=1.0, tensor_active=0.93)
        for t in range(1200, 2700)
    ]
    points += [
        second(
            t,
            sm_active=0.0,
            gr_engine_active=0.0,
            gpu_util=0.99,
            pcie_tx_bytes_per_second=55e9,
            pcie_rx_bytes_per_second=55e9,
        )
        for t in range(2700, 3300)
    ]
    points += [second(t, sm_active=0.0, gr_engine_active=0.0, gpu_util=0.0,
                      fb_used_bytes=23 * GIB) for t in range(3300, 3600)]  # fmt: skip
    i = integrate(points, 0, 3600, Thresholds())
    usage = Usage()
    usage.add(i)
    s = Summary("j")
    s.add_line(Line("j", 1, 3600.0, usage, 4.0))
    from service.costs.money import figures
    from service.costs.recommend import FixAssumptions

    row = figures(s, FixAssumptions())
    causes: Any = row["causes"]
    assert causes["launch_bound"]["seconds"] == pytest.approx(1200)
    assert causes["launch_bound"]["usd"] == pytest.approx(4 / 3)
    assert causes["compute_tensor"]["seconds"] == pytest.approx(1500)
    assert causes["transfer_bound"]["usd"] == pytest.approx(4 * 600 / 3600)
    assert causes["idle_held"]["seconds"] == pytest.approx(300)
    assert row["idle_seconds"] == pytest.approx(300)
    assert row["unused_seconds"] == pytest.approx(2159.64)
    # idle_held $0.33 in full + each inefficient cause's dollars x its fix's saving fraction
    # (from the signals the samples carry): the waste is the cause fixes' savings.
    from service.costs.recommend import cause_fixes

    fixes = {f.cause: f for f in cause_fixes(s, FixAssumptions())}
    assert row["idle_usd"] == pytest.approx(1 / 3)
    assert row["fixable_usd"] == pytest.approx(
        sum(f.saving_usd or 0.0 for c, f in fixes.items() if c not in ("idle_held", "idle_empty"))
    )
    assert row["fixable_usd"] == pytest.approx(
        4 / 3 * fixes["launch_bound"].saving_fraction
        + 2 / 3 * fixes["transfer_bound"].saving_fraction
    )
    assert row["waste_usd"] == pytest.approx(float(row["idle_usd"]) + float(row["fixable_usd"]))  # type: ignore[arg-type]
    assert row["top_cause"] == "launch_bound"


def test_energy_is_split_by_cause() -> None:
    """Power integrated over each cause's seconds; the causes' energy adds up to the total."""
    from service.core.diagnosis import Cause

    points = [
        ActivityPoint(0.0, 0.0, 1, int(Cause.IDLE_HELD), 100.0),
        ActivityPoint(10.0, 0.96, 1, int(Cause.COMPUTE_TENSOR), 600.0),
        ActivityPoint(20.0, None, None, None, 80.0),  # no activity figure: nodata, no energy
    ]
    got = integrate(points, 0.0, 30.0, Thresholds())
    assert got.idle_held_energy_joules == 1000.0
    assert got.compute_tensor_energy_joules == 6000.0
    assert got.energy_used_joules == sum(got.cause_energy_joules().values()) == 7000.0
