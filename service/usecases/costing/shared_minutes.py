"""The cost lines of a shared GPU's minutes, read from the tenant rows its rollups split them into.

Whole minutes are summed in the database; a minute a report's window cuts is read on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection

from service.core import diagnosis
from service.costs.integrals import INTEGRAL_FIELDS
from service.costs.prices import PriceRow, change_points
from service.costs.tenants import SplitRule, tenant_line
from service.costs.waste import Line, Segment, Usage
from service.db import tenants_repo
from service.db.costing import costs_repo
from service.settings import Settings

MINUTE = timedelta(minutes=1)

PriceOf = Callable[[Segment], float | None]  # USD per GPU-hour of a segment, None if unpriced


@dataclass(slots=True)
class _Ranges:
    """The whole shared minutes to sum, (gpu_id, start, end) at one price each, and the minutes
    (gpu_id, minute start) the window cuts."""

    spans: list[tuple[int, datetime, datetime]] = field(default_factory=list)
    prices: list[float | None] = field(default_factory=list)  # USD per GPU-hour, per span
    edges: set[tuple[int, datetime]] = field(default_factory=set)


def shared_lines(
    conn: Connection,
    *,
    stretches: dict[int, list[tuple[datetime, datetime]]],
    gpu_info: dict[int, costs_repo.GpuInfo],
    held_from_of: dict[int, datetime],
    end: datetime,
    prices: Sequence[PriceRow],
    price_of: PriceOf,
    raw_from: datetime,
    settings: Settings,
) -> tuple[list[Line], set[str]]:
    """The lines of the shared minutes of [held_from, end) of each GPU, from their tenant rows,
    and the split rules those rows were written under.

    Whole minutes are summed in the database per GPU and price (one line per job, GPU and
    price); a minute the window cuts is read row by row and counts in part: the part raw
    samples still hold is split again from them, an older part pro rata.
    """
    ranges = _Ranges()
    for gpu_id, runs in stretches.items():
        info = gpu_info.get(gpu_id)
        held_from = held_from_of.get(gpu_id)
        if info is None or held_from is None or held_from >= end:
            continue
        _add_ranges(ranges, gpu_id, runs, info.model, held_from, end, prices, price_of)
    lines, rules = _summed_lines(conn, ranges)
    edge_lines, edge_rules, cut_minutes = _edge_lines(
        conn, ranges.edges, held_from_of=held_from_of, end=end, raw_from=raw_from, price_of=price_of
    )
    lines += edge_lines
    rules |= edge_rules
    thresholds = diagnosis.thresholds_of(settings)
    for (gpu_id, bucket), (lo, hi, rule) in cut_minutes.items():
        price = price_of(Segment(gpu_id, bucket, bucket + MINUTE, ()))
        for part in tenants_repo.split_part(
            conn, gpu_id=gpu_id, start=lo, end=hi, thresholds=thresholds, rule=SplitRule(rule)
        ):
            line = tenant_line(part, 1.0)
            line.usd_per_gpu_hour = price
            lines.append(line)
    return lines, rules


def _ceil_minute(ts: datetime) -> datetime:
    floor = ts.replace(second=0, microsecond=0)
    return floor if floor == ts else floor + MINUTE


def _add_ranges(
    out: _Ranges,
    gpu_id: int,
    runs: list[tuple[datetime, datetime]],
    model: str,
    held_from: datetime,
    end: datetime,
    prices: Sequence[PriceRow],
    price_of: PriceOf,
) -> None:
    """Add one GPU's whole shared minutes of [held_from, end), cut where the price changes, and
    the minutes at the window's edges that fall in its stretches (``runs``)."""
    held_from = held_from.astimezone(UTC)  # a window may come in any time zone
    first, last = _ceil_minute(held_from), end.astimezone(UTC).replace(second=0, microsecond=0)
    cut = {m for m in (held_from.replace(second=0, microsecond=0), last) if m < first or m >= last}
    # A minute's price is the one in force at its start.
    bounds = sorted({_ceil_minute(c) for c in change_points(prices, model, held_from, end)})
    for a, b in runs:
        out.edges |= {(gpu_id, m) for m in cut if a <= m < b and m < end}
    # No minute outside the stretches has rows: one range from the first to the last,
    # cut where the price changes, sums them all.
    lo, hi = max(runs[0][0], first), min(runs[-1][1], last)
    for cut_at in [*(c for c in bounds if lo < c < hi), hi]:
        if lo < cut_at:
            out.spans.append((gpu_id, lo, cut_at))
            out.prices.append(price_of(Segment(gpu_id, lo, cut_at, ())))
        lo = cut_at


def _summed_lines(conn: Connection, ranges: _Ranges) -> tuple[list[Line], set[str]]:
    """One line per tenant, GPU and price over the ranges' whole minutes, and their rules."""
    rules: set[str] = set()
    by_key: dict[tuple[str, int, float | None], Line] = {}
    for k, tenant, rule, sums in tenants_repo.sum_ranges(conn, ranges.spans):
        rules.add(rule)
        gpu_id = ranges.spans[k][0]
        key = (tenant, gpu_id, ranges.prices[k])
        line = by_key.get(key)
        if line is None:
            line = by_key[key] = Line(tenant or None, gpu_id, 0.0, Usage(), ranges.prices[k])
        line.held_seconds += sums[0]
        usage = line.usage
        for name, value in zip(INTEGRAL_FIELDS, sums[1:], strict=True):
            setattr(usage, name, getattr(usage, name) + value)
    return list(by_key.values()), rules


def _edge_lines(
    conn: Connection,
    edges: set[tuple[int, datetime]],
    *,
    held_from_of: dict[int, datetime],
    end: datetime,
    raw_from: datetime,
    price_of: PriceOf,
) -> tuple[list[Line], set[str], dict[tuple[int, datetime], tuple[datetime, datetime, str]]]:
    """The lines of the edge minutes' parts in the window, pro rata from their tenant rows, and
    their rules; the parts raw samples still hold come back instead, as (start, end, rule) by
    (gpu_id, minute start), to be split again from them."""
    lines: list[Line] = []
    rules: set[str] = set()
    cut_minutes: dict[tuple[int, datetime], tuple[datetime, datetime, str]] = {}
    for row in tenants_repo.minutes_at(conn, sorted(edges)):
        bucket = row["bucket_start"]
        lo, hi = max(bucket, held_from_of[row["gpu_id"]]), min(bucket + MINUTE, end)
        if lo >= hi:
            continue
        rules.add(row["split_rule"])
        if hi - lo < MINUTE and lo >= raw_from:
            # The window cuts this minute: its part is split again from the raw samples,
            # since a job's share of the whole minute says nothing of where in it it fell.
            cut_minutes[(row["gpu_id"], bucket)] = (lo, hi, row["split_rule"])
            continue
        line = tenant_line(row, (hi - lo) / MINUTE)
        line.usd_per_gpu_hour = price_of(Segment(row["gpu_id"], bucket, bucket + MINUTE, ()))
        lines.append(line)
    return lines, rules, cut_minutes
