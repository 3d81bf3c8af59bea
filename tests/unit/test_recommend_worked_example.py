"""The worked example of docs/diagnosis.md (recommendations, right-sizing, energy), computed."""

from __future__ import annotations

import pytest

from service.costs.recommend import FixAssumptions, total_saving_usd
from service.costs.rightsizing import GpuUse, fit_mig, recommend_job
from service.costs.waste import Line, Summary, Usage

GIB = 1024**3
# (cause, seconds, activity, watts): the H100 job of the causes' worked example, with the
# power the H200 drew in each phase (docs/gpu-check).
PHASES = [
    ("launch_bound", 1200.0, 0.0003, 124.0),
    ("compute_tensor", 1500.0, 0.96, 691.0),
    ("transfer_bound", 600.0, 0.0, 136.0),
    ("idle_held", 300.0, 0.0, 123.0),
]


def example() -> Summary:
    usage = Usage()
    for cause, seconds, activity, watts in PHASES:
        setattr(usage, f"{cause}_seconds", seconds)
        setattr(usage, f"{cause}_energy_joules", seconds * watts)
        usage.covered_seconds += seconds
        usage.unused_seconds += seconds * (1 - activity)
        usage.energy_used_joules += seconds * watts
    usage.idle_seconds = usage.idle_held_seconds
    s = Summary("slurm:4242")
    s.add_line(Line("slurm:4242", 1, 3600.0, usage, 4.0))
    return s


def test_the_worked_example() -> None:
    s = example()
    # The pinned copies moved 29 GB/s each way (the H200's figure); the bf16 phase kept DRAM
    # 0.3 busy; nothing crossed NVLink.
    gpu = GpuUse("GPU-0", "NVIDIA H100 80GB HBM3", 85_520_809_984, 23 * GIB, s,
                 peak_dram_active=0.3, peak_pcie_bytes_per_second=29e9,
                 peak_nvlink_bytes_per_second=0.0)  # fmt: skip
    fixes = recommend_job(s, [gpu], FixAssumptions())
    got = [(f.cause or f.profile, round(f.saving_usd or 0, 2)) for f in fixes]
    # No slice: 600 of the 3,300 running seconds (18%) waited on copies, and a slice has a
    # fraction of the copy engines.
    assert got == [("launch_bound", 0.67), ("idle_held", 0.33), ("transfer_bound", 0.33)]
    assert total_saving_usd(fixes) == pytest.approx(1.333, abs=0.001)
    # Nor without the copy-bound rule: the job's activity while running, 0.44, fits 4/7 of
    # the SMs today, but with the launch and copy fixes the same work runs in 2,400 of its
    # 3,300 running seconds (0.60), more than 4/7.
    loose = recommend_job(s, [gpu], FixAssumptions(mig_transfer_share=1.0))
    assert not [f for f in loose if f.kind == "mig"]
    assert fit_mig(gpu, 0.4365, FixAssumptions()) is not None  # 4g.40gb before the fixes
    assert s.usage.energy_used_joules / 3.6e6 == pytest.approx(0.3622, abs=1e-4)
    assert s.usage.idle_held_energy_joules / 3.6e6 == pytest.approx(0.01025, abs=1e-5)
