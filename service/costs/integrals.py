"""Per-GPU time integrals of design section 4 (covered, idle, idle-held, unused seconds).

Pure: takes samples and a window, returns numbers. Each sample stands for the time from its
timestamp to the next sample's, cut at ``max_gap``; time no sample covers is nodata and is
never counted as idle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ActivityPoint:
    """What the integrals need from one sample; timestamps are Unix seconds."""

    ts: float
    sm_active: float | None
    gpu_util: float | None = None
    fb_used_bytes: float | None = None
    power_watts: float | None = None


@dataclass(slots=True)
class Integrals:
    """Seconds (and joules) accumulated over a window for one GPU; all fields add up."""

    covered_seconds: float = 0.0
    idle_seconds: float = 0.0
    idle_held_seconds: float = 0.0
    unused_seconds: float = 0.0
    fallback_seconds: float = 0.0  # covered time whose activity came from gpu_util, not SM
    energy_used_joules: float = 0.0

    def add(self, other: Integrals, factor: float = 1.0) -> None:
        """Add ``factor`` times each field of ``other`` into the same field of this one."""
        # Spelled out: reports add tens of thousands of these, and a loop over the field
        # names costs three times as much.
        self.covered_seconds += factor * other.covered_seconds
        self.idle_seconds += factor * other.idle_seconds
        self.idle_held_seconds += factor * other.idle_held_seconds
        self.unused_seconds += factor * other.unused_seconds
        self.fallback_seconds += factor * other.fallback_seconds
        self.energy_used_joules += factor * other.energy_used_joules


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The waste-model thresholds: idle below ``idle``, held above ``held_bytes``."""

    max_gap_seconds: float = 60.0
    idle: float = 0.05
    held_bytes: float = float(1024**3)


def integrate(
    points: Sequence[ActivityPoint], start: float, end: float, thresholds: Thresholds
) -> Integrals:
    """Integrals over [start, end) from ``points`` sorted by ts (include one point before start)."""
    out = Integrals()
    n = len(points)
    for i, p in enumerate(points):
        cover_end = p.ts + thresholds.max_gap_seconds
        if i + 1 < n and points[i + 1].ts < cover_end:
            cover_end = points[i + 1].ts
        lo = max(p.ts, start)
        hi = min(cover_end, end)
        if hi <= lo:
            continue
        dt = hi - lo
        activity = p.sm_active
        if activity is None:
            activity = p.gpu_util
            if activity is None:
                continue  # no activity figure: nodata, never idle
            out.fallback_seconds += dt
        out.covered_seconds += dt
        out.unused_seconds += dt * (1.0 - activity)
        if activity < thresholds.idle:
            out.idle_seconds += dt
            if p.fb_used_bytes is not None and p.fb_used_bytes > thresholds.held_bytes:
                out.idle_held_seconds += dt
        if p.power_watts is not None:
            out.energy_used_joules += dt * p.power_watts
    return out
