"""Attribution: each GPU's time in a window split into job shares and unallocated time, with
usage and price, from allocations, tenant rows, rollups and raw samples."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import Connection

from service.core import diagnosis
from service.costs.prices import PriceRow, change_points, price_lookup
from service.costs.tenants import without_stretches
from service.costs.waste import Line, Segment, group_segments, segment_gpu
from service.db import tenants_repo
from service.db.costing import cost_sums, costs_repo
from service.settings import Settings
from service.usecases.costing.shared_minutes import PriceOf, shared_lines
from service.usecases.price_table import PriceSource, effective_prices

log = logging.getLogger(__name__)

_NEVER = datetime.max.replace(tzinfo=UTC)  # a raw-retention cutoff no edge is after


@dataclass(slots=True)
class Attribution:
    """Lines of a report window, with the GPUs and jobs they name."""

    lines: list[Line]
    gpus: dict[int, costs_repo.GpuInfo]
    jobs: dict[str, dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    price_source: PriceSource = "default"
    split_rules: set[str] = field(default_factory=set)  # rules the shared minutes were split by


class _Held(NamedTuple):
    """The GPUs' segments outside their shared stretches, when each is held from, and when
    each one lost was reported lost."""

    segments: list[Segment]
    held_from_of: dict[int, datetime]
    lost_at: dict[int, datetime]


def attribute(
    conn: Connection,
    *,
    settings: Settings,
    start: datetime,
    end: datetime,
    now: datetime,
    gpu_ids: Sequence[int] | None = None,
    raw_edges: bool | None = True,
    causes: bool = True,
    cause_energy: bool = False,
    gpu_info: dict[int, costs_repo.GpuInfo] | None = None,
    rolled: dict[int, datetime | None] | None = None,
) -> Attribution:
    """Split every GPU's [start, end) into job shares and unallocated time, with usage and price.

    Without ``causes`` the seconds per cause are not summed (they read 0): only the
    benchmark uses that, to price what summing them costs.

    With ``raw_edges`` the seconds at each share's edges come from raw samples (while raw
    retention holds them), else pro rata from their 1m bucket: at most a minute's error per
    edge, for reports over thousands of jobs where reading raw samples would dominate; None
    decides by the number of such spans (``report_raw_edge_spans``). ``gpu_info``: the GPUs
    as ``costs_repo.load_gpus`` has them, where the caller loaded them already; ``rolled``:
    every GPU's ``costs_repo.rolled_until``, where the caller read it already.
    """
    end = min(end, now)
    table = effective_prices(conn, settings)
    gpu_info = _wanted_gpus(conn, gpu_ids, gpu_info)
    allocations, job_info = costs_repo.load_allocations(
        conn, start=start, end=end, now=now, gpu_ids=gpu_ids
    )
    stretches = tenants_repo.shared_stretches(conn, start=start, end=end, gpu_ids=gpu_ids)
    held = _held_segments(allocations, gpu_info, table.rows, stretches, start=start, end=end)
    price_of, unpriced = _pricer(table.rows, gpu_info)
    raw_from = now - timedelta(days=settings.retention_raw_days)
    lines = _segment_lines(
        conn, held, price_of, whole_fleet=gpu_ids is None, settings=settings, now=now,
        raw_from=raw_from, raw_edges=raw_edges, causes=causes, cause_energy=cause_energy,
        rolled=rolled,
    )  # fmt: skip
    tenant_lines, rules = shared_lines(
        conn, stretches=stretches, gpu_info=gpu_info, held_from_of=held.held_from_of, end=end,
        prices=table.rows, price_of=price_of, raw_from=raw_from, settings=settings,
    )  # fmt: skip
    lines += tenant_lines
    # Without prices (GPUWARDEN_PRICES=none) every GPU is unpriced by design: nothing to warn.
    warnings = [] if table.source == "none" else [unpriced_warning(m) for m in sorted(unpriced)]
    for warning in warnings:
        log.warning(warning)
    return Attribution(lines, gpu_info, job_info, warnings, table.source, rules)


def _wanted_gpus(
    conn: Connection,
    gpu_ids: Sequence[int] | None,
    gpu_info: dict[int, costs_repo.GpuInfo] | None,
) -> dict[int, costs_repo.GpuInfo]:
    """The GPUs of ``gpu_ids`` (all without), from ``gpu_info`` where the caller loaded them."""
    if gpu_info is None:
        return costs_repo.load_gpus(conn, gpu_ids=gpu_ids)
    if gpu_ids is None:
        return gpu_info
    wanted = set(gpu_ids)
    return {g: info for g, info in gpu_info.items() if g in wanted}


def _held_segments(
    allocations: Sequence[Any],
    gpu_info: dict[int, costs_repo.GpuInfo],
    prices: Sequence[PriceRow],
    stretches: dict[int, list[tuple[datetime, datetime]]],
    *,
    start: datetime,
    end: datetime,
) -> _Held:
    """Each GPU's [start, end) while it is held, cut where its jobs or its price change, less
    the stretches it was shared (read from their own tenant rows)."""
    by_gpu: dict[int, list[Any]] = defaultdict(list)
    for allocation in allocations:
        by_gpu[allocation.gpu_id].append(allocation)
    held = _Held([], {}, {})
    for gpu_id, info in gpu_info.items():
        # A GPU is held from when it is known: one first seen a minute ago is not held all week;
        # a destroyed MIG instance is held no longer.
        held_from = held.held_from_of[gpu_id] = max(start, info.known_from)
        held_until = min(end, info.retired_at) if info.retired_at is not None else end
        if held_from < held_until:
            cuts = change_points(prices, info.model, held_from, held_until)
            if info.lost_at is not None:
                # From lost_at its unsampled seconds are lost, not nodata.
                held.lost_at[gpu_id] = info.lost_at
                cuts = [*cuts, info.lost_at]
            segs = segment_gpu(gpu_id, by_gpu.get(gpu_id, []), held_from, held_until, cuts)
            # Minutes a shared GPU's jobs were split for are read from their own rows below.
            held.segments.extend(without_stretches(segs, stretches.get(gpu_id, [])))
    return held


def _pricer(
    prices: Sequence[PriceRow], gpu_info: dict[int, costs_repo.GpuInfo]
) -> tuple[PriceOf, set[str]]:
    """The USD per GPU-hour of a segment (its GPU's model at its start), and the set it adds
    each model no price matches to."""
    unpriced: set[str] = set()
    lookup = price_lookup(prices)

    def price_of(seg: Segment) -> float | None:
        row = lookup(gpu_info[seg.gpu_id].model, seg.start)
        if row is None:
            unpriced.add(gpu_info[seg.gpu_id].model)
            return None
        return row.usd_per_gpu_hour

    return price_of, unpriced


def _segment_lines(
    conn: Connection,
    held: _Held,
    price_of: PriceOf,
    *,
    whole_fleet: bool,
    settings: Settings,
    now: datetime,
    raw_from: datetime,
    raw_edges: bool | None,
    causes: bool,
    cause_energy: bool,
    rolled: dict[int, datetime | None] | None = None,
) -> list[Line]:
    """One line per job, GPU, price and lost flag over the held segments, its usage summed in
    the database (see ``attribute`` for ``raw_edges``, ``causes`` and ``cause_energy``)."""
    keys, held_seconds, spans = group_segments(held.segments, price_of, held.lost_at)
    usages = cost_sums.sum_usage(
        conn,
        spans=spans,
        n_groups=len(keys),
        thresholds=diagnosis.thresholds_of(settings),
        raw_cutoff=raw_from if _raw_edges(raw_edges, spans, raw_from, settings) else _NEVER,
        minute_cutoff=now - timedelta(days=settings.retention_1m_days),
        causes=causes,
        cause_energy=cause_energy,
        rolled_until=(
            rolled if rolled is not None else _rolled_until(conn, spans, whole_fleet=whole_fleet)
        ),
        raw_kept_from=raw_from,
    )
    return [
        Line(job_id, gpu_id, seconds, usage, price, lost)
        for (job_id, gpu_id, price, lost), seconds, usage in zip(
            keys, held_seconds, usages, strict=True
        )
    ]


def _rolled_until(
    conn: Connection, spans: Sequence[Any], *, whole_fleet: bool
) -> dict[int, datetime | None]:
    """``costs_repo.rolled_until`` of the GPUs with a span: none read where no GPU has one,
    every GPU read (no ids bound) where the spans are the ``whole_fleet``'s and many."""
    spanned = {span.gpu_id for span in spans}
    if not spanned:
        return {}
    # Binding ten thousand ids costs more than reading the few GPUs without a span.
    if whole_fleet and 2 * len(spanned) > costs_repo.BIND_IDS_MAX:
        return costs_repo.rolled_until(conn, gpu_ids=None)
    return costs_repo.rolled_until(conn, gpu_ids=sorted(spanned))


def _raw_edges(
    wanted: bool | None, spans: Sequence[Any], raw_from: datetime, settings: Settings
) -> bool:
    """Whether to read the spans' edges from raw samples: as ``wanted``, or (None) when at most
    ``report_raw_edge_spans`` spans have an edge raw retention holds."""
    if wanted is not None:
        return wanted
    limit = settings.report_raw_edge_spans
    recent = 0
    for span in spans:
        if span.end >= raw_from:
            recent += 1
            if recent > limit:
                return False
    return True


def unpriced_warning(model: str) -> str:
    """What a report says of a GPU model no price matches."""
    return (
        f"no price matches GPU model {model!r}: its cost is null; add a pattern with PUT "
        "/api/v1/prices"
    )
