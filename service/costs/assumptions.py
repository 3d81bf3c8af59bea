"""The figures recommendations estimate savings with, read from the settings that hold them.

Pure: the settings come in as any object with these fields (``service.settings.Settings`` has
them); the five cause thresholds a fix shares with the waste model are read once, by
``service.core.diagnosis.thresholds_of``.
"""

from __future__ import annotations

from typing import Protocol

from service.core.diagnosis import ThresholdSettings, thresholds_of
from service.costs.recommend import FixAssumptions


class FixSettings(ThresholdSettings, Protocol):
    """The settings the fix assumptions come from beside the thresholds' (ratios; speed-ups in
    times faster)."""

    @property
    def fix_tensor_speedup(self) -> float: ...
    @property
    def fix_memory_speedup(self) -> float: ...
    @property
    def rightsize_idle_gpu_fraction(self) -> float: ...
    @property
    def rightsize_mig_memory_headroom(self) -> float: ...


def fix_assumptions_of(s: FixSettings) -> FixAssumptions:
    """The fix assumptions the settings ``s`` give (the one place the fixes' own are read)."""
    t = thresholds_of(s)
    return FixAssumptions(
        tensor_speedup=s.fix_tensor_speedup,
        memory_speedup=s.fix_memory_speedup,
        starved_util=t.starved_util,
        launch_fill=t.launch_fill,
        busy=t.busy,
        idle_gpu_fraction=s.rightsize_idle_gpu_fraction,
        mig_memory_headroom=s.rightsize_mig_memory_headroom,
        launch_min_util=t.launch_min_util,
        transfer_bytes_per_second=t.transfer_bytes_per_second,
    )
