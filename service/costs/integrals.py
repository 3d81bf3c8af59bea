"""Per-GPU time integrals of the waste model (covered, idle, idle-held, unused seconds, and
seconds per cause).

Pure: takes samples (with the decision stored for each, see ``core.diagnosis``) and a window,
returns numbers. Each sample stands for the time from its timestamp to the next sample's, cut
at ``max_gap``; time no sample covers is nodata and is never counted as idle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from functools import reduce
from operator import add

from service.core.diagnosis import (
    CAUSE_NAMES,
    CAUSES,
    IDLE_CAUSES,
    Cause,
    Rung,
    Thresholds,
    duty_of,
)

__all__ = [
    "CAUSE_ENERGY_FIELDS",
    "CAUSE_FIELDS",
    "CAUSE_SIGNALS",
    "IDLE_FIELDS",
    "INTEGRAL_FIELDS",
    "SIGNAL_FIELDS",
    "SIGNAL_METRICS",
    "ActivityPoint",
    "Integrals",
    "Thresholds",
    "idle_seconds_of",
    "integrate",
    "stored_point",
]

# The per-cause integral fields, in Cause order: ``<cause>_seconds``.
CAUSE_FIELDS: tuple[str, ...] = tuple(f"{name}_seconds" for name in CAUSE_NAMES)
# The energy (joules, power integrated) burned in each cause, in Cause order.
CAUSE_ENERGY_FIELDS: tuple[str, ...] = tuple(f"{name}_energy_joules" for name in CAUSE_NAMES)
# The seconds of the causes in which nothing ran, whose sum is ``idle_seconds``.
IDLE_FIELDS: tuple[str, ...] = tuple(CAUSE_FIELDS[c.column] for c in IDLE_CAUSES)


@dataclass(frozen=True, slots=True)
class CauseSignal:
    """One measured signal integrated over the seconds of one cause: ``field`` is the sum of
    ``signal`` x seconds (the signal a ratio, or bytes per second for ``pcie``); a fix's
    recoverable share is computed from its mean (``service.costs.recoverable``)."""

    field: str
    cause: Cause
    signal: str  # "duty", "activity", "dram" or "pcie": an attribute of ActivityPoint


# Declared once: the rollup columns, the raw-sample sums and the tenant split follow it.
CAUSE_SIGNALS: tuple[CauseSignal, ...] = (
    CauseSignal("input_starved_duty_seconds", Cause.INPUT_STARVED, "duty"),
    CauseSignal("launch_bound_duty_seconds", Cause.LAUNCH_BOUND, "duty"),
    CauseSignal("compute_no_tensor_active_seconds", Cause.COMPUTE_NO_TENSOR, "activity"),
    CauseSignal("memory_bound_dram_seconds", Cause.MEMORY_BOUND, "dram"),
    CauseSignal("transfer_bound_pcie_bytes", Cause.TRANSFER_BOUND, "pcie"),
)
SIGNAL_FIELDS: tuple[str, ...] = tuple(s.field for s in CAUSE_SIGNALS)
_SIGNAL_BY_CODE: dict[int, CauseSignal] = {int(s.cause): s for s in CAUSE_SIGNALS}


@dataclass(frozen=True, slots=True)
class ActivityPoint:
    """What the integrals need from one sample: its Unix time, the stored activity (ratio),
    rung and cause (None without an activity figure: nodata), its power, and the signals of
    CAUSE_SIGNALS: the duty cycle (ratio, as the cause rules read it), DRAM activity (ratio)
    and the busier PCIe direction (bytes per second)."""

    ts: float
    activity: float | None
    rung: int | None = None
    cause: int | None = None
    power_watts: float | None = None
    duty: float | None = None
    dram: float | None = None
    pcie: float | None = None

    def signal_of(self, cause: int) -> float | None:
        """The sample's value of the signal integrated for ``cause`` (None: none is, or the
        sample lacks it)."""
        sig = _SIGNAL_BY_CODE.get(cause)
        if sig is None:
            return None
        value: float | None = getattr(self, sig.signal)
        return value


def stored_point(
    ts: float,
    activity: float | None,
    rung: int | None,
    cause: int | None,
    power_watts: float | None,
    values: Mapping[str, float | None],
) -> ActivityPoint:
    """The point of a stored sample: its stored decision and ``values``, the metrics the
    signals are read from (gr_engine_active, gpu_util, dram_active, the PCIe rates)."""
    if activity is None or rung is None or cause is None:
        return ActivityPoint(ts, activity, rung, cause, power_watts)
    return ActivityPoint(
        ts, activity, rung, cause, power_watts, duty_of(values, Rung(rung)),
        values.get("dram_active"), busier_pcie(values),
    )  # fmt: skip


# The sample columns stored_point reads its signals from.
SIGNAL_METRICS: tuple[str, ...] = (
    "gr_engine_active", "gpu_util", "dram_active",
    "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second",
)  # fmt: skip


def busier_pcie(values: Mapping[str, float | None]) -> float | None:
    """The busier PCIe direction of a sample (bytes per second), None if neither is reported."""
    tx, rx = values.get("pcie_tx_bytes_per_second"), values.get("pcie_rx_bytes_per_second")
    if tx is None and rx is None:
        return None
    return max(tx or 0.0, rx or 0.0)


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
    sham_seconds: float = 0.0
    hung_seconds: float = 0.0
    idle_empty_energy_joules: float = 0.0
    idle_held_energy_joules: float = 0.0
    launch_bound_energy_joules: float = 0.0
    input_starved_energy_joules: float = 0.0
    transfer_bound_energy_joules: float = 0.0
    memory_bound_energy_joules: float = 0.0
    compute_no_tensor_energy_joules: float = 0.0
    compute_tensor_energy_joules: float = 0.0
    unclassified_energy_joules: float = 0.0
    sham_energy_joules: float = 0.0
    hung_energy_joules: float = 0.0
    # CAUSE_SIGNALS: each a signal x seconds summed over its cause's seconds.
    input_starved_duty_seconds: float = 0.0
    launch_bound_duty_seconds: float = 0.0
    compute_no_tensor_active_seconds: float = 0.0
    memory_bound_dram_seconds: float = 0.0
    transfer_bound_pcie_bytes: float = 0.0

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
        self.sham_seconds += factor * other.sham_seconds
        self.hung_seconds += factor * other.hung_seconds
        self.idle_empty_energy_joules += factor * other.idle_empty_energy_joules
        self.idle_held_energy_joules += factor * other.idle_held_energy_joules
        self.launch_bound_energy_joules += factor * other.launch_bound_energy_joules
        self.input_starved_energy_joules += factor * other.input_starved_energy_joules
        self.transfer_bound_energy_joules += factor * other.transfer_bound_energy_joules
        self.memory_bound_energy_joules += factor * other.memory_bound_energy_joules
        self.compute_no_tensor_energy_joules += factor * other.compute_no_tensor_energy_joules
        self.compute_tensor_energy_joules += factor * other.compute_tensor_energy_joules
        self.unclassified_energy_joules += factor * other.unclassified_energy_joules
        self.sham_energy_joules += factor * other.sham_energy_joules
        self.hung_energy_joules += factor * other.hung_energy_joules
        self.input_starved_duty_seconds += factor * other.input_starved_duty_seconds
        self.launch_bound_duty_seconds += factor * other.launch_bound_duty_seconds
        self.compute_no_tensor_active_seconds += factor * other.compute_no_tensor_active_seconds
        self.memory_bound_dram_seconds += factor * other.memory_bound_dram_seconds
        self.transfer_bound_pcie_bytes += factor * other.transfer_bound_pcie_bytes

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
_CAUSE_FIELD_BY_CODE: dict[int, str] = {int(c): CAUSE_FIELDS[c.column] for c in CAUSES}
_CAUSE_ENERGY_BY_CODE: dict[int, str] = {int(c): CAUSE_ENERGY_FIELDS[c.column] for c in CAUSES}
_GPU_UTIL = int(Rung.GPU_UTIL)


def add_signal(out: Integrals, p: ActivityPoint, cause: int, seconds: float) -> None:
    """Add the sample's signal for ``cause`` x ``seconds`` to its CAUSE_SIGNALS field."""
    value = p.signal_of(cause)
    if value is not None:
        field = _SIGNAL_BY_CODE[cause].field
        setattr(out, field, getattr(out, field) + value * seconds)


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
        add_signal(out, p, p.cause, dt)
        if p.power_watts is not None:
            joules = dt * p.power_watts
            out.energy_used_joules += joules
            energy = _CAUSE_ENERGY_BY_CODE[p.cause]
            setattr(out, energy, getattr(out, energy) + joules)
    out.idle_seconds = idle_seconds_of(out)
    return out


def idle_seconds_of(u: Integrals) -> float:
    """The seconds of ``u`` in which nothing ran: its idle causes' seconds added."""
    return float(reduce(add, (getattr(u, f) for f in IDLE_FIELDS)))
