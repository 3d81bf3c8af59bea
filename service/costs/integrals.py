"""Per-GPU time integrals of the waste model (covered, idle, idle-held, unused seconds, and
seconds per cause).

Pure: takes samples (with the decision stored for each, see ``service.diagnosis``) and a window,
returns numbers. Each sample stands for the time from its timestamp to the next sample's, cut
at ``max_gap``; time no sample covers is nodata and is never counted as idle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from service.diagnosis import CAUSE_NAMES, Cause, Rung, Thresholds, decide

__all__ = [
    "CAUSE_ENERGY_FIELDS",
    "CAUSE_FIELDS",
    "INTEGRAL_FIELDS",
    "ActivityPoint",
    "Integrals",
    "Thresholds",
    "integrate",
    "point_of",
]

# The per-cause integral fields, in Cause order: ``<cause>_seconds``.
CAUSE_FIELDS: tuple[str, ...] = tuple(f"{name}_seconds" for name in CAUSE_NAMES)
# The energy (joules, power integrated) burned in each cause, in Cause order.
CAUSE_ENERGY_FIELDS: tuple[str, ...] = tuple(f"{name}_energy_joules" for name in CAUSE_NAMES)


@dataclass(frozen=True, slots=True)
class ActivityPoint:
    """What the integrals need from one sample: its Unix time, the stored activity (ratio),
    rung and cause (None without an activity figure: nodata), and its power."""

    ts: float
    activity: float | None
    rung: int | None = None
    cause: int | None = None
    power_watts: float | None = None


def point_of(
    ts: float,
    values: Mapping[str, float | None],
    thresholds: Thresholds,
    *,
    has_process: bool = False,
) -> ActivityPoint:
    """The point of a sample given by its metric values, deciding activity and cause now."""
    d = decide(values, thresholds, has_process=has_process)
    power = values.get("power_watts")
    if d is None:
        return ActivityPoint(ts, None, None, None, power)
    return ActivityPoint(ts, d.activity, int(d.rung), int(d.cause), power)


@dataclass(slots=True)
class Integrals:
    """Seconds (and joules) accumulated over a window for one GPU; all fields add up.

    idle_seconds is idle_empty + idle_held seconds (nothing running); the ``<cause>_seconds``
    add up to covered_seconds.
    """

    covered_seconds: float = 0.0
    idle_seconds: float = 0.0
    idle_held_seconds: float = 0.0
    unused_seconds: float = 0.0
    fallback_seconds: float = 0.0  # covered time whose activity came from gpu_util, not SM
    energy_used_joules: float = 0.0
    idle_empty_seconds: float = 0.0
    # idle_held_seconds above is the idle_held cause's seconds.
    launch_bound_seconds: float = 0.0
    input_starved_seconds: float = 0.0
    transfer_bound_seconds: float = 0.0
    memory_bound_seconds: float = 0.0
    compute_no_tensor_seconds: float = 0.0
    compute_tensor_seconds: float = 0.0
    unclassified_seconds: float = 0.0
    idle_empty_energy_joules: float = 0.0
    idle_held_energy_joules: float = 0.0
    launch_bound_energy_joules: float = 0.0
    input_starved_energy_joules: float = 0.0
    transfer_bound_energy_joules: float = 0.0
    memory_bound_energy_joules: float = 0.0
    compute_no_tensor_energy_joules: float = 0.0
    compute_tensor_energy_joules: float = 0.0
    unclassified_energy_joules: float = 0.0

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
        self.idle_empty_seconds += factor * other.idle_empty_seconds
        self.launch_bound_seconds += factor * other.launch_bound_seconds
        self.input_starved_seconds += factor * other.input_starved_seconds
        self.transfer_bound_seconds += factor * other.transfer_bound_seconds
        self.memory_bound_seconds += factor * other.memory_bound_seconds
        self.compute_no_tensor_seconds += factor * other.compute_no_tensor_seconds
        self.compute_tensor_seconds += factor * other.compute_tensor_seconds
        self.unclassified_seconds += factor * other.unclassified_seconds
        self.idle_empty_energy_joules += factor * other.idle_empty_energy_joules
        self.idle_held_energy_joules += factor * other.idle_held_energy_joules
        self.launch_bound_energy_joules += factor * other.launch_bound_energy_joules
        self.input_starved_energy_joules += factor * other.input_starved_energy_joules
        self.transfer_bound_energy_joules += factor * other.transfer_bound_energy_joules
        self.memory_bound_energy_joules += factor * other.memory_bound_energy_joules
        self.compute_no_tensor_energy_joules += factor * other.compute_no_tensor_energy_joules
        self.compute_tensor_energy_joules += factor * other.compute_tensor_energy_joules
        self.unclassified_energy_joules += factor * other.unclassified_energy_joules

    def cause_seconds(self) -> dict[str, float]:
        """Covered seconds per cause name, in Cause order."""
        return {name: getattr(self, f) for name, f in zip(CAUSE_NAMES, CAUSE_FIELDS, strict=True)}

    def cause_energy_joules(self) -> dict[str, float]:
        """Energy (joules) per cause name, in Cause order."""
        return {
            name: getattr(self, f) for name, f in zip(CAUSE_NAMES, CAUSE_ENERGY_FIELDS, strict=True)
        }


# Every field of Integrals, in order: the rollup columns and the report columns follow it.
INTEGRAL_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Integrals))
_CAUSE_FIELD_BY_CODE: dict[int, str] = {int(c): f for c, f in zip(Cause, CAUSE_FIELDS, strict=True)}
_CAUSE_ENERGY_BY_CODE: dict[int, str] = {
    int(c): f for c, f in zip(Cause, CAUSE_ENERGY_FIELDS, strict=True)
}
_GPU_UTIL = int(Rung.GPU_UTIL)


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
        activity = p.activity
        if activity is None or p.cause is None:
            continue  # no activity figure: nodata, never idle
        dt = hi - lo
        if p.rung == _GPU_UTIL:
            out.fallback_seconds += dt
        out.covered_seconds += dt
        out.unused_seconds += dt * (1.0 - activity)
        field = _CAUSE_FIELD_BY_CODE[p.cause]
        setattr(out, field, getattr(out, field) + dt)
        if p.power_watts is not None:
            joules = dt * p.power_watts
            out.energy_used_joules += joules
            energy = _CAUSE_ENERGY_BY_CODE[p.cause]
            setattr(out, energy, getattr(out, energy) + joules)
    out.idle_seconds = out.idle_empty_seconds + out.idle_held_seconds
    return out
