"""A job's progress counter (issue 46): which readings are accepted, and what they add up to.

A reading is the job's running total of steps, samples or tokens at a time. Readings of a job
keep one unit, come in time order and never go down. Pure: readings in, a decision or a summary
out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise

from service.errors import Conflict, ValidationFailed
from service.vocabulary import PROGRESS_UNITS, ProgressUnit


@dataclass(frozen=True, slots=True)
class Reading:
    """One progress reading: the job's running total ``value`` in ``unit`` at ``at``."""

    at: datetime
    unit: ProgressUnit
    value: float


@dataclass(frozen=True, slots=True)
class ProgressSummary:
    """What a job's readings say: the unit, the first and last totals, the units advanced
    between them, the rate per second over that time and when the total last went up."""

    unit: ProgressUnit
    readings: int
    first_at: datetime
    last_at: datetime
    first_value: float
    last_value: float
    units_advanced: float
    rate_per_second: float | None
    last_advanced_at: datetime | None


def check_value(value: float) -> None:
    """Raise ValidationFailed (naming ``value``) for a total that is negative or not finite."""
    if not math.isfinite(value):
        raise ValidationFailed("value", f"must be a finite number, not {value!r}")
    if value < 0:
        raise ValidationFailed("value", f"is a running total and may not be negative ({value!r})")


def check_unit(unit: str) -> ProgressUnit:
    """``unit`` as a progress unit; ValidationFailed (naming ``unit``) if it is none of them."""
    for known in PROGRESS_UNITS:
        if unit == known:
            return known
    raise ValidationFailed("unit", f"{unit!r} is not one of {', '.join(PROGRESS_UNITS)}")


def is_repeat(new: Reading, last: Reading | None) -> bool:
    """Whether ``new`` is ``last`` sent again (a retry): stored once, answered as accepted."""
    return last is not None and new == last


def check_next(new: Reading, last: Reading | None) -> None:
    """Raise unless ``new`` may follow ``last``, the job's latest stored reading: a bad value
    or unit is a ValidationFailed; a unit change, a reading older than the last or a total
    below the last is a Conflict naming ``unit``, ``at`` or ``value``."""
    check_value(new.value)
    check_unit(new.unit)
    if last is None:
        return
    if new.unit != last.unit:
        raise Conflict(
            f"unit: this job reports progress in {last.unit}; a job keeps one unit (got {new.unit})"
        )
    if new.at < last.at:
        raise Conflict(
            f"at: {new.at.isoformat()} is before the job's last reading "
            f"({last.at.isoformat()}); readings come in time order"
        )
    if new.value < last.value:
        raise Conflict(
            f"value: {new.value:g} is below the job's last total {last.value:g} {last.unit}; "
            "progress is a monotonic running total (not monotonic)"
        )


def summarize(readings: Sequence[Reading]) -> ProgressSummary | None:
    """The summary of a job's readings in time order; None for a job that reported none."""
    if not readings:
        return None
    first, last = readings[0], readings[-1]
    advanced = last.value - first.value
    seconds = (last.at - first.at).total_seconds()
    rate = advanced / seconds if seconds > 0 else None
    last_advanced_at = None
    for before, after in pairwise(readings):
        if after.value > before.value:
            last_advanced_at = after.at
    return ProgressSummary(
        unit=last.unit,
        readings=len(readings),
        first_at=first.at,
        last_at=last.at,
        first_value=first.value,
        last_value=last.value,
        units_advanced=advanced,
        rate_per_second=rate,
        last_advanced_at=last_advanced_at,
    )


def gpu_seconds_per_unit(held_gpu_seconds: float, summary: ProgressSummary | None) -> float | None:
    """GPU-seconds per unit of progress: the job's held GPU-seconds over the units it advanced;
    None where it reported no progress or none advanced (the unit is then the whole run)."""
    if summary is None or summary.units_advanced <= 0:
        return None
    return held_gpu_seconds / summary.units_advanced


# A unit's name for one of it ("1.6 GPU-seconds per step").
_SINGULAR: dict[ProgressUnit, str] = {"steps": "step", "samples": "sample", "tokens": "token"}


@dataclass(frozen=True, slots=True)
class UnitOfWork:
    """What a job's GPU time is counted per: one unit of its reported progress, or the whole
    run where it reported none; ``gpu_seconds_per_unit`` is None for the whole run."""

    unit: str  # step, sample, token, or run
    gpu_seconds_per_unit: float | None
    text: str


def unit_of_work(held_gpu_seconds: float, summary: ProgressSummary | None) -> UnitOfWork:
    """The job's unit of work and its GPU-seconds per unit, said in words."""
    per_unit = gpu_seconds_per_unit(held_gpu_seconds, summary)
    if summary is None or per_unit is None:
        why = "reported no progress" if summary is None else "reported no advance"
        return UnitOfWork(
            unit="run",
            gpu_seconds_per_unit=None,
            text=f"the job {why}: its unit of work is the whole run "
            f"({held_gpu_seconds / 3600:.2f} GPU-h, a fixed-size job's figure per run)",
        )
    one = _SINGULAR[summary.unit]
    return UnitOfWork(
        unit=one,
        gpu_seconds_per_unit=per_unit,
        text=f"{per_unit:.4g} GPU-seconds per {one} ({summary.units_advanced:,.0f} "
        f"{summary.unit} in {held_gpu_seconds / 3600:.2f} GPU-h)",
    )
