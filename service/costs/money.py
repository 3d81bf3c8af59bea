"""What a group's GPUs cost and how much of it is waste (USD): the one money model of every
surface (API, CSV, CLI, console, /metrics, alerts).

Pure. ``cost`` is every held second at its price; it splits without remainder into the causes'
dollars plus ``nodata`` and ``lost``. ``waste`` = the idle causes' dollars in full (nothing ran:
certain) + each inefficient cause's dollars x its fix's saving fraction (an estimate, with the
assumption ``recommend.fix_fraction`` states, from the group's own signals where they
tell): the sum of the cause fixes' savings, by construction. ``nodata`` and ``lost`` are
never waste.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal, get_args

from service.core.diagnosis import CAUSES, IDLE_CAUSES, WASTE_CAUSES, Cause, Decision
from service.costs.integrals import CAUSE_SIGNALS, Integrals, stored_point
from service.costs.recommend import FixAssumptions, fix_fraction
from service.costs.waste import Summary

# What a list of groups can be sorted by (largest first); every list ranks by waste by default.
SortBy = Literal["waste", "cost", "idle", "fixable"]
SORT_BYS: tuple[str, ...] = get_args(SortBy)
SORT_FIELDS: dict[str, str] = {
    "waste": "waste_usd",
    "cost": "cost_usd",
    "idle": "idle_usd",
    "fixable": "fixable_usd",
}
# The GPU-hours beside each: what unpriced groups (a site without prices) rank by.
SORT_HOURS: dict[str, str] = {
    "waste": "waste_gpu_hours",
    "cost": "held_gpu_hours",
    "idle": "idle_gpu_hours",
    "fixable": "fixable_gpu_hours",
}
FIXABLE_CAUSES: tuple[Cause, ...] = tuple(c for c in WASTE_CAUSES if c not in IDLE_CAUSES)


SIGNAL_FIELD_OF: dict[Cause, str] = {s.cause: s.field for s in CAUSE_SIGNALS}


def waste_share(cause: Cause, a: FixAssumptions, usage: Integrals | None = None) -> float:
    """The share of a cause's dollars that is waste: 1 for the idle causes, the fix's saving
    fraction for an inefficient one (from the group's own signals in ``usage`` where they
    tell), 0 for healthy or unclassified time."""
    if cause not in WASTE_CAUSES:
        return 0.0
    return fix_fraction(cause, a, usage)[0]


def sample_waste_share(
    d: Decision, values: Mapping[str, float | None], model: str | None, a: FixAssumptions
) -> float:
    """The waste share of one sample's cause, its fix's share read from that sample's own
    signal on a GPU of ``model``: what the GPU state's rule (``diagnosis.gpu_state``) reads."""
    point = stored_point(0.0, d.activity, int(d.rung), int(d.cause), None, values)
    usage = Integrals(covered_seconds=1.0)
    setattr(usage, f"{d.cause.label}_seconds", 1.0)
    signal = point.signal_of(int(d.cause))
    field = SIGNAL_FIELD_OF.get(d.cause)
    if signal is not None and field is not None:
        setattr(usage, field, signal)
    return waste_share(d.cause, replace(a, gpu_model=model), usage)


@dataclass(frozen=True, slots=True)
class Money:
    """A group's dollars (None when some held second had no price) and its top waste cause."""

    cost_usd: float | None
    waste_usd: float | None
    idle_usd: float | None
    fixable_usd: float | None
    nodata_usd: float | None
    lost_usd: float | None
    top_cause: str | None
    cause_waste_usd: dict[str, float | None]
    # The same figures in GPU-hours (held seconds / 3600): never None, priced or not.
    held_gpu_hours: float = 0.0
    waste_gpu_hours: float = 0.0
    idle_gpu_hours: float = 0.0
    fixable_gpu_hours: float = 0.0


def money_of(
    summary: Summary, a: FixAssumptions, shares: Mapping[Cause, float] | None = None
) -> Money:
    """The cost, waste (idle + fixable), nodata and lost USD of a summary, and its top cause:
    the waste cause whose fix saves the most (by dollars, or by seconds when unpriced).
    ``shares``: the waste shares of some causes (``waste_share``), where the caller has them."""
    priced = summary.priced
    waste_by_cause: dict[str, float] = {}
    waste_seconds: dict[str, float] = {}
    best, best_value = None, 0.0
    for cause in CAUSES:
        if not summary.cause_usd(cause) and not summary.cause_seconds(cause):
            waste_by_cause[cause.label] = waste_seconds[cause.label] = 0.0  # no time in it
            continue
        known = shares.get(cause) if shares is not None else None
        share = waste_share(cause, a, summary.usage) if known is None else known
        waste = summary.cause_usd(cause) * share
        waste_by_cause[cause.label] = waste
        waste_seconds[cause.label] = summary.cause_seconds(cause) * share
        value = waste if priced else waste_seconds[cause.label]
        if value > best_value + 1e-12:
            best, best_value = cause.label, value
    idle = sum(waste_by_cause[c.label] for c in IDLE_CAUSES)
    fixable = sum(waste_by_cause[c.label] for c in FIXABLE_CAUSES)
    idle_hours = sum(waste_seconds[c.label] for c in IDLE_CAUSES) / 3600.0
    fixable_hours = sum(waste_seconds[c.label] for c in FIXABLE_CAUSES) / 3600.0

    def usd(value: float) -> float | None:
        return value if priced else None

    return Money(
        cost_usd=usd(summary.cost_usd),
        waste_usd=usd(idle + fixable),
        idle_usd=usd(idle),
        fixable_usd=usd(fixable),
        nodata_usd=usd(summary.nodata_usd),
        lost_usd=usd(summary.lost_usd),
        top_cause=best,
        cause_waste_usd={k: usd(v) for k, v in waste_by_cause.items()},
        held_gpu_hours=summary.held_seconds / 3600.0,
        waste_gpu_hours=idle_hours + fixable_hours,
        idle_gpu_hours=idle_hours,
        fixable_gpu_hours=fixable_hours,
    )


def figures(
    summary: Summary, a: FixAssumptions, shares: Mapping[Cause, float] | None = None
) -> dict[str, object]:
    """A report row's seconds, joules and dollars of one group (dollars None if unpriced)."""
    u = summary.usage
    m = money_of(summary, a, shares)
    priced = summary.priced
    return {
        "key": summary.key,
        "gpus": len(summary.gpu_ids),
        "jobs": len(summary.job_ids),
        "held_seconds": summary.held_seconds,
        "allocated_seconds": u.covered_seconds,
        "nodata_seconds": summary.nodata_seconds,
        "lost_seconds": summary.lost_seconds,
        "idle_seconds": u.idle_seconds,
        "idle_held_seconds": u.idle_held_seconds,
        "unused_seconds": u.unused_seconds,
        "fallback_seconds": u.fallback_seconds,
        "energy_used_joules": u.energy_used_joules,
        "efficiency": summary.efficiency,
        "cost_usd": m.cost_usd,
        "waste_usd": m.waste_usd,
        "idle_usd": m.idle_usd,
        "fixable_usd": m.fixable_usd,
        "nodata_usd": m.nodata_usd,
        "lost_usd": m.lost_usd,
        "unpriced_seconds": summary.unpriced_seconds,
        "held_gpu_hours": m.held_gpu_hours,
        "waste_gpu_hours": m.waste_gpu_hours,
        "idle_gpu_hours": m.idle_gpu_hours,
        "fixable_gpu_hours": m.fixable_gpu_hours,
        "top_cause": m.top_cause,
        "causes": {
            c.label: {
                "seconds": summary.cause_seconds(c),
                "usd": summary.cause_usd(c) if priced else None,
                "waste_usd": m.cause_waste_usd[c.label],
            }
            for c in CAUSES
        },
    }


def rank(value: object, key: str, hours: object = None) -> tuple[bool, float, str]:
    """Where a row with ``value`` dollars sorts in a list: largest first, unpriced (None)
    last, those largest ``hours`` (GPU-hours) first, then by key."""
    if value is None:
        return (True, -float(hours) if isinstance(hours, int | float) else 0.0, key)
    return (False, -float(value) if isinstance(value, int | float) else 0.0, key)


def sort_rows(rows: list[dict[str, object]], sort_by: str = "waste") -> list[dict[str, object]]:
    """Rows largest ``sort_by`` dollars first (unpriced last, by GPU-hours), then by key."""
    name, hours = SORT_FIELDS[sort_by], SORT_HOURS[sort_by]
    return sorted(
        rows,
        key=lambda row: rank(row.get(name), str(row.get("key", row.get("id", ""))), row.get(hours)),
    )
