"""The figures recommendations estimate savings with, read from the settings that hold them.

Pure: the settings come in as any object with these fields (``service.settings.Settings`` has
them), as ``service.core.diagnosis.thresholds_of`` reads the waste-model thresholds.
"""

from __future__ import annotations

from typing import Protocol

from service.costs.recommend import FixAssumptions


class FixSettings(Protocol):
    """The settings the fix assumptions come from (ratios; speed-ups in times faster)."""

    @property
    def fix_tensor_speedup(self) -> float: ...
    @property
    def fix_memory_speedup(self) -> float: ...
    @property
    def cause_starved_util(self) -> float: ...
    @property
    def cause_launch_fill(self) -> float: ...
    @property
    def cause_busy(self) -> float: ...
    @property
    def rightsize_idle_gpu_fraction(self) -> float: ...
    @property
    def rightsize_mig_memory_headroom(self) -> float: ...
    @property
    def cause_launch_min_util(self) -> float: ...
    @property
    def cause_transfer_bytes_per_second(self) -> float: ...


def fix_assumptions_of(s: FixSettings) -> FixAssumptions:
    """The fix assumptions the settings ``s`` give (the one place they are read)."""
    return FixAssumptions(
        tensor_speedup=s.fix_tensor_speedup,
        memory_speedup=s.fix_memory_speedup,
        starved_util=s.cause_starved_util,
        launch_fill=s.cause_launch_fill,
        busy=s.cause_busy,
        idle_gpu_fraction=s.rightsize_idle_gpu_fraction,
        mig_memory_headroom=s.rightsize_mig_memory_headroom,
        launch_min_util=s.cause_launch_min_util,
        transfer_bytes_per_second=s.cause_transfer_bytes_per_second,
    )
