"""Cost reports and job summaries: loads jobs, GPUs, prices and integrals, applies the waste model.

This is the edge that reads the database; the arithmetic lives in ``waste`` and ``prices``.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import Connection

from service.core import diagnosis
from service.core.diagnosis import CAUSE_BY_NAME
from service.costs.default_prices import DEFAULT_PRICES
from service.costs.integrals import INTEGRAL_FIELDS, Thresholds
from service.costs.money import SORT_BYS, figures, sort_rows
from service.costs.prices import PriceRow, change_points, price_at, price_lookup
from service.costs.prices import parse_price_rows as parse_price_list
from service.costs.recommend import (
    FixAssumptions,
    GpuUse,
    cause_fixes,
    recommend_job,
    total_saving_usd,
    with_model,
)
from service.costs.tenants import SplitRule, tenant_line, without_stretches
from service.costs.waste import (
    GROUP_BYS,
    HARDWARE_GROUP_BYS,
    UNALLOCATED,
    Line,
    Segment,
    Summary,
    Usage,
    group_segments,
    segment_gpu,
    summarize,
)
from service.db import cost_sums, costs_repo, gpus_repo, jobs_repo, prices_repo, tenants_repo
from service.errors import ConfigError, ValidationFailed
from service.settings import Settings, load_config_file
from service.usecases import day_sums as day_sums_mod

log = logging.getLogger(__name__)

MINUTE = timedelta(minutes=1)
_NEVER = datetime.max.replace(tzinfo=UTC)  # a raw-retention cutoff no edge is after
UNKNOWN = day_sums_mod.UNKNOWN  # a job without the user or team a report groups by


def thresholds_of(settings: Settings) -> Thresholds:
    """The waste-model thresholds from settings."""
    return diagnosis.thresholds_of(settings)


def fix_assumptions_of(settings: Settings) -> FixAssumptions:
    """The figures recommendations estimate savings with, from settings."""
    return FixAssumptions(
        tensor_speedup=settings.fix_tensor_speedup,
        memory_speedup=settings.fix_memory_speedup,
        starved_util=settings.cause_starved_util,
        launch_fill=settings.cause_launch_fill,
        busy=settings.cause_busy,
        idle_gpu_fraction=settings.rightsize_idle_gpu_fraction,
        mig_memory_headroom=settings.rightsize_mig_memory_headroom,
        launch_min_util=settings.cause_launch_min_util,
        transfer_bytes_per_second=settings.cause_transfer_bytes_per_second,
    )


JOULES_PER_KWH = 3.6e6
TOP_FIXES = 3  # fixes a report row names


def with_energy(row: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """The row with its energy in kWh and that energy's cost at ``energy_usd_per_kwh``."""
    kwh = float(row["energy_used_joules"]) / JOULES_PER_KWH
    row["energy_kwh"] = kwh
    row["energy_usd"] = kwh * settings.energy_usd_per_kwh
    return row


def _for_gpus(a: FixAssumptions, att: Attribution, summary: Summary) -> FixAssumptions:
    """``a`` for the summary's GPUs: their model where they share one."""
    models = {att.gpus[g].model for g in summary.gpu_ids if g in att.gpus}
    return _with_one_model(a, models.pop()) if len(models) == 1 else a


@lru_cache(maxsize=64)
def _with_one_model(a: FixAssumptions, model: str) -> FixAssumptions:
    """``with_model`` for one model, kept: a report asks for each of its rows."""
    return with_model(a, [model])


def report_row(summary: Summary, settings: Settings, a: FixAssumptions) -> dict[str, Any]:
    """A report row: the summary's figures, its energy and its top fixes by USD saved (their
    savings add up to the row's waste_usd)."""
    fixes = cause_fixes(summary, a)
    # The fixes' saving fractions are the causes' waste shares: worked out once, not twice.
    shares = {
        cause: f.saving_fraction
        for f in fixes
        if f.cause is not None and (cause := CAUSE_BY_NAME[f.cause]) in diagnosis.WASTE_CAUSES
    }
    row = with_energy(figures(summary, a, shares), settings)
    row["fixes"] = [f.as_dict() for f in fixes[:TOP_FIXES]]
    return row


def parse_price_rows(items: Any, *, where: str) -> list[PriceRow]:
    """Price rows from the YAML ``prices:`` list; ConfigError names the bad field."""
    try:
        return parse_price_list(items, where=where)
    except ValidationFailed as exc:
        raise ConfigError(f"config file: {exc}") from exc


@dataclass(frozen=True, slots=True)
class PriceTable:
    """The price rows in force and where they came from (api, config or default)."""

    rows: list[PriceRow]
    source: Literal["api", "config", "default"]


def effective_prices(conn: Connection, settings: Settings) -> PriceTable:
    """The stored table if one was PUT, else the config file's ``prices:``, else the defaults."""
    stored = prices_repo.load_prices(conn)
    if stored:
        return PriceTable(stored, "api")
    from_file = config_prices(settings.config)
    if from_file:
        return PriceTable(list(from_file), "config")
    return PriceTable(list(DEFAULT_PRICES), "default")


def config_prices(path: Path | None) -> tuple[PriceRow, ...]:
    """The config file's ``prices:`` rows (none without a file or the key).

    Reports, scrapes and notifications all ask; the file is read and parsed again only when its
    modification time, size or inode changed, so an edit still takes effect without a restart.
    """
    if path is None:
        return ()
    try:
        st = path.stat()
    except OSError:
        load_config_file(path)  # raises the ConfigError that names the missing file
        raise
    return _parsed_prices(path, st.st_mtime_ns, st.st_size, st.st_ino)


@lru_cache(maxsize=8)
def _parsed_prices(path: Path, mtime_ns: int, size: int, inode: int) -> tuple[PriceRow, ...]:
    """The ``prices:`` rows of ``path`` as it was at (mtime_ns, size, inode): the cache key."""
    config = load_config_file(path)
    return tuple(parse_price_rows(config.get("prices") or [], where="prices"))


@dataclass(slots=True)
class Attribution:
    """Lines of a report window, with the GPUs and jobs they name."""

    lines: list[Line]
    gpus: dict[int, costs_repo.GpuInfo]
    jobs: dict[str, dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    price_source: Literal["api", "config", "default"] = "default"
    split_rules: set[str] = field(default_factory=set)  # rules the shared minutes were split by


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
) -> Attribution:
    """Split every GPU's [start, end) into job shares and unallocated time, with usage and price.

    Without ``causes`` the seconds per cause are not summed (they read 0): only the
    benchmark uses that, to price what summing them costs.

    With ``raw_edges`` the seconds at each share's edges come from raw samples (while raw
    retention holds them), else pro rata from their 1m bucket: at most a minute's error per
    edge, for reports over thousands of jobs where reading raw samples would dominate; None
    decides by the number of such spans (``report_raw_edge_spans``). ``gpu_info``: the GPUs
    as ``costs_repo.load_gpus`` has them, where the caller loaded them already.
    """
    end = min(end, now)
    table = effective_prices(conn, settings)
    prices = table.rows
    if gpu_info is None:
        gpu_info = costs_repo.load_gpus(conn, gpu_ids=gpu_ids)
    elif gpu_ids is not None:
        wanted = set(gpu_ids)
        gpu_info = {g: info for g, info in gpu_info.items() if g in wanted}
    allocations, job_info = costs_repo.load_allocations(
        conn, start=start, end=end, now=now, gpu_ids=gpu_ids
    )
    by_gpu: dict[int, list[Any]] = defaultdict(list)
    for allocation in allocations:
        by_gpu[allocation.gpu_id].append(allocation)
    segments: list[Segment] = []
    stretches = tenants_repo.shared_stretches(conn, start=start, end=end, gpu_ids=gpu_ids)
    held_from_of: dict[int, datetime] = {}
    lost_at: dict[int, datetime] = {}
    for gpu_id, info in gpu_info.items():
        # A GPU is held from when it is known: one first seen a minute ago is not held all week;
        # a destroyed MIG instance is held no longer.
        held_from = held_from_of[gpu_id] = max(start, info.known_from)
        held_until = min(end, info.retired_at) if info.retired_at is not None else end
        if held_from < held_until:
            cuts = change_points(prices, info.model, held_from, held_until)
            if info.lost_at is not None:
                # From lost_at its unsampled seconds are lost, not nodata.
                lost_at[gpu_id] = info.lost_at
                cuts = [*cuts, info.lost_at]
            segs = segment_gpu(gpu_id, by_gpu.get(gpu_id, []), held_from, held_until, cuts)
            # Minutes a shared GPU's jobs were split for are read from their own rows below.
            segments += without_stretches(segs, stretches.get(gpu_id, []))
    unpriced: set[str] = set()
    lookup = price_lookup(prices)

    def price_of(seg: Segment) -> float | None:
        row = lookup(gpu_info[seg.gpu_id].model, seg.start)
        if row is None:
            unpriced.add(gpu_info[seg.gpu_id].model)
            return None
        return row.usd_per_gpu_hour

    keys, held, spans = group_segments(segments, price_of, lost_at)
    raw_from = now - timedelta(days=settings.retention_raw_days)
    usages = cost_sums.sum_usage(
        conn,
        spans=spans,
        n_groups=len(keys),
        thresholds=thresholds_of(settings),
        raw_cutoff=raw_from if _raw_edges(raw_edges, spans, raw_from, settings) else _NEVER,
        minute_cutoff=now - timedelta(days=settings.retention_1m_days),
        causes=causes,
        cause_energy=cause_energy,
        rolled_until=costs_repo.rolled_until(conn, gpu_ids=list(gpu_info)),
        raw_kept_from=raw_from,
    )
    lines = [
        Line(job_id, gpu_id, seconds, usage, price, lost)
        for (job_id, gpu_id, price, lost), seconds, usage in zip(keys, held, usages, strict=True)
    ]
    tenant_lines, rules = shared_lines(
        conn, stretches=stretches, gpu_info=gpu_info, held_from_of=held_from_of, end=end,
        prices=prices, price_of=price_of, raw_from=raw_from, settings=settings,
    )  # fmt: skip
    lines += tenant_lines
    warnings = [unpriced_warning(model) for model in sorted(unpriced)]
    for warning in warnings:
        log.warning(warning)
    return Attribution(lines, gpu_info, job_info, warnings, table.source, rules)


def unpriced_warning(model: str) -> str:
    """What a report says of a GPU model no price matches."""
    return (
        f"no price matches GPU model {model!r}: its cost is null; add a pattern with PUT "
        "/api/v1/prices"
    )


def report_attribution(
    conn: Connection,
    *,
    settings: Settings,
    start: datetime,
    end: datetime,
    now: datetime,
    raw_edges: bool | None,
    group_by: str,
    user: str | None = None,
    team: str | None = None,
    day_sums: bool = True,
) -> tuple[Attribution, day_sums_mod.DaySums | None]:
    """A report window's lines and, with ``day_sums``, the sums of its whole UTC days: those of
    every GPU whose days are all summed and current (``day_sums.stale_in``), grouped by
    ``group_by`` (jobs of ``user`` and ``team`` only, if given). The days' edges, and the whole
    days of the other GPUs, are attributed from finer data (rollups, tenant rows, raw edges)
    as without day sums."""
    window = day_sums_mod.whole_days(start, min(end, now)) if day_sums else None
    if window is None:
        return attribute(
            conn, settings=settings, start=start, end=end, now=now, raw_edges=raw_edges
        ), None  # fmt: skip
    d0, d1 = window
    gpus = costs_repo.load_gpus(conn)
    basis = day_sums_mod.basis_of(effective_prices(conn, settings).rows, settings)
    stale, unpriced = day_sums_mod.stale_in(conn, gpus=gpus, start=d0, end=d1, basis=basis)
    if len(stale) >= len(gpus):
        return attribute(
            conn, settings=settings, start=start, end=end, now=now, raw_edges=raw_edges,
            gpu_info=gpus,
        ), None  # fmt: skip
    parts: list[tuple[datetime, datetime, list[int] | None]] = [(start, d0, None), (d1, end, None)]
    if stale:
        parts.append((d0, d1, sorted(stale)))
    atts = [
        attribute(
            conn, settings=settings, start=a, end=b, now=now, raw_edges=raw_edges,
            gpu_ids=ids, gpu_info=gpus,
        )
        for a, b, ids in parts
        if a < min(b, now)
    ]  # fmt: skip
    days = day_sums_mod.read_days(
        conn, start=d0, end=d1, excluded=stale, group_by=group_by, user=user, team=team
    )
    warnings = {w for att in atts for w in att.warnings}
    warnings |= {unpriced_warning(gpus[g].model) for g in unpriced if g in gpus and g not in stale}
    merged = Attribution(
        [line for att in atts for line in att.lines],
        gpus,
        {k: v for att in atts for k, v in att.jobs.items()} | days.jobs,
        sorted(warnings),
        atts[0].price_source if atts else effective_prices(conn, settings).source,
        {rule for att in atts for rule in att.split_rules},
    )
    return merged, days


def add_days(
    groups: dict[str, Summary], days: day_sums_mod.DaySums, att: Attribution, group_by: str
) -> None:
    """Merge the summed days (grouped already, or per GPU for hardware) into ``groups``."""
    pieces = list(days.groups.items())
    for gpu_id, summary in days.by_gpu.items():
        info = att.gpus[gpu_id]
        pieces.append(({"node": info.node, "gpu_model": info.model}.get(group_by, info.uuid),
                       summary))  # fmt: skip
    for key, summary in pieces:
        group = groups.get(key)
        if group is None:
            group = groups[key] = Summary(key)
        group.merge(summary)


def _ceil_minute(ts: datetime) -> datetime:
    floor = ts.replace(second=0, microsecond=0)
    return floor if floor == ts else floor + MINUTE


def shared_lines(
    conn: Connection,
    *,
    stretches: dict[int, list[tuple[datetime, datetime]]],
    gpu_info: dict[int, costs_repo.GpuInfo],
    held_from_of: dict[int, datetime],
    end: datetime,
    prices: Sequence[PriceRow],
    price_of: Callable[[Segment], float | None],
    raw_from: datetime,
    settings: Settings,
) -> tuple[list[Line], set[str]]:
    """The lines of the shared minutes of [held_from, end) of each GPU, from their tenant rows,
    and the split rules those rows were written under.

    Whole minutes are summed in the database per GPU and price (one line per job, GPU and
    price); a minute the window cuts is read row by row and counts in part: the part raw
    samples still hold is split again from them, an older part pro rata.
    """
    ranges: list[tuple[int, datetime, datetime]] = []
    range_prices: list[float | None] = []
    edges: set[tuple[int, datetime]] = set()
    for gpu_id, runs in stretches.items():
        info = gpu_info.get(gpu_id)
        held_from = held_from_of.get(gpu_id)
        if info is None or held_from is None or held_from >= end:
            continue
        held_from = held_from.astimezone(UTC)  # a window may come in any time zone
        first, last = _ceil_minute(held_from), end.astimezone(UTC).replace(second=0, microsecond=0)
        cut = {
            m for m in (held_from.replace(second=0, microsecond=0), last) if m < first or m >= last
        }
        # A minute's price is the one in force at its start.
        bounds = sorted(
            {_ceil_minute(c) for c in change_points(prices, info.model, held_from, end)}
        )
        for a, b in runs:
            edges |= {(gpu_id, m) for m in cut if a <= m < b and m < end}
        # No minute outside the stretches has rows: one range from the first to the last,
        # cut where the price changes, sums them all.
        lo, hi = max(runs[0][0], first), min(runs[-1][1], last)
        for cut_at in [*(c for c in bounds if lo < c < hi), hi]:
            if lo < cut_at:
                ranges.append((gpu_id, lo, cut_at))
                range_prices.append(price_of(Segment(gpu_id, lo, cut_at, ())))
            lo = cut_at
    rules: set[str] = set()
    by_key: dict[tuple[str, int, float | None], Line] = {}
    for k, tenant, rule, sums in tenants_repo.sum_ranges(conn, ranges):
        rules.add(rule)
        gpu_id = ranges[k][0]
        key = (tenant, gpu_id, range_prices[k])
        line = by_key.get(key)
        if line is None:
            line = by_key[key] = Line(tenant or None, gpu_id, 0.0, Usage(), range_prices[k])
        line.held_seconds += sums[0]
        usage = line.usage
        for name, value in zip(INTEGRAL_FIELDS, sums[1:], strict=True):
            setattr(usage, name, getattr(usage, name) + value)
    lines = list(by_key.values())
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
    for (gpu_id, bucket), (lo, hi, rule) in cut_minutes.items():
        price = price_of(Segment(gpu_id, bucket, bucket + MINUTE, ()))
        for part in tenants_repo.split_part(
            conn, gpu_id=gpu_id, start=lo, end=hi, thresholds=thresholds_of(settings),
            rule=SplitRule(rule),
        ):  # fmt: skip
            line = tenant_line(part, 1.0)
            line.usd_per_gpu_hour = price
            lines.append(line)
    return lines, rules


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


def _key_fn(att: Attribution, group_by: str) -> Any:
    def key(line: Line) -> str:
        if group_by == "node":
            return att.gpus[line.gpu_id].node
        if group_by == "gpu_model":
            return att.gpus[line.gpu_id].model
        if group_by == "gpu":
            return att.gpus[line.gpu_id].uuid
        assert line.job_id is not None
        if group_by == "job":
            return line.job_id
        value = att.jobs.get(line.job_id, {}).get(group_by)
        return value if value else UNKNOWN

    return key


def check_range(settings: Settings, *, start: datetime, end: datetime, now: datetime) -> None:
    """Refuse a start after end, or a start older than any data kept (1h rollup retention)."""
    if start.tzinfo is None or end.tzinfo is None:
        raise ValidationFailed("start", "timestamps need a timezone, e.g. 2026-12-02T08:00:00Z")
    if start >= end:
        raise ValidationFailed("start", "must be before end")
    oldest = now - timedelta(days=settings.retention_1h_days)
    if start < oldest:
        raise ValidationFailed(
            "start",
            f"{start.isoformat()} is older than the retention of the data "
            f"(1h rollups keep {settings.retention_1h_days:g} days, so no earlier than "
            f"{oldest.isoformat()})",
        )


def cost_report(
    conn: Connection,
    *,
    settings: Settings,
    start: datetime,
    end: datetime,
    now: datetime,
    group_by: str,
    user: str | None = None,
    team: str | None = None,
    cause: str | None = None,
    sort_by: str = "waste",
    causes: bool = True,
    raw_edges: bool | None = None,
    day_sums: bool = True,
) -> dict[str, Any]:
    """The cost report over [start, end) grouped by ``group_by``: USD and seconds, largest
    ``sort_by`` dollars first (waste by default), only the groups whose top cause is ``cause``
    if given, with totals over the rows shown (seconds per cause left at 0 without ``causes``,
    which only the benchmark asks for; edges read as ``attribute``'s ``raw_edges`` says).
    Whole UTC days are read from the day sums where they are current (without ``day_sums``,
    which only the benchmark and tests ask for, every second from finer data)."""
    if group_by not in GROUP_BYS:
        raise ValidationFailed("group_by", f"unknown group_by {group_by!r}; one of {GROUP_BYS}")
    if sort_by not in SORT_BYS:
        raise ValidationFailed("sort", f"unknown sort {sort_by!r}; one of {SORT_BYS}")
    waste_causes = tuple(c.label for c in diagnosis.WASTE_CAUSES)
    if cause is not None and cause not in waste_causes:
        raise ValidationFailed("cause", f"unknown cause {cause!r}; one of {waste_causes}")
    check_range(settings, start=start, end=end, now=now)
    hardware = group_by in HARDWARE_GROUP_BYS
    if causes:
        att, days = report_attribution(
            conn, settings=settings, start=start, end=end, now=now, raw_edges=raw_edges,
            group_by=group_by, user=user, team=team, day_sums=day_sums,
        )  # fmt: skip
    else:
        att, days = attribute(
            conn, settings=settings, start=start, end=end, now=now, raw_edges=raw_edges,
            causes=False,
        ), None  # fmt: skip
    lines = att.lines
    if user is not None or team is not None:

        def keep(line: Line) -> bool:
            if line.job_id is None:
                return False
            job = att.jobs.get(line.job_id, {})
            return (user is None or job.get("user") == user) and (
                team is None or job.get("team") == team
            )

        lines = [ln for ln in lines if keep(ln)]
    groups = summarize(lines, _key_fn(att, group_by), jobs_only=not hardware)
    if days is not None:
        add_days(groups, days, att, group_by)
    assumptions = fix_assumptions_of(settings)
    faults = report_faults(conn, att, start=start, end=end, now=now, settings=settings) if (
        group_by == "job"
    ) else {}  # fmt: skip
    total = Summary("__total__")
    rows = []
    for summary in groups.values():
        row = report_row(summary, settings, _for_gpus(assumptions, att, summary))
        if cause is not None and row["top_cause"] != cause:
            continue
        total.merge(summary)
        if group_by == "job" and summary.key != UNALLOCATED:
            job = att.jobs.get(summary.key, {})
            row.update(
                user=job.get("user"),
                team=job.get("team"),
                project=job.get("project"),
                faults=faults.get(summary.key, []),
            )
        rows.append(row)
    return {
        "start": start,
        "end": end,
        "group_by": group_by,
        "sort": sort_by,
        "rows": sort_rows(rows, sort_by),
        "totals": report_row(total, settings, _for_gpus(assumptions, att, total)),
        "price_source": att.price_source,
        "split_rule": settings.cost_split_rule,
        "warnings": att.warnings
        + _explanations(att, total)
        + split_rule_notes(att.split_rules, settings.cost_split_rule),
    }


DEFAULT_PRICES_NOTE = (
    "prices are GPU Warden's shipped defaults (approximate public on-demand prices, see "
    "docs/costs.md); set yours with PUT /api/v1/prices or prices: in the config file"
)


def _explanations(att: Attribution, total: Summary) -> list[str]:
    """What a first report needs said: why it may be empty, and whose prices it uses (samples
    not rolled up yet are read raw, so they need no word)."""
    out = []
    if not att.gpus:
        out.append(
            "no GPU has reported yet: start an agent on a GPU node (gpuwarden agent) "
            "or try gpuwarden demo"
        )
    if att.price_source == "default" and total.held_seconds > 0:
        out.append(DEFAULT_PRICES_NOTE)
    return out


def split_rule_notes(stored: set[str], current: str) -> list[str]:
    """What a report says when some shared minutes were split by another rule than today's."""
    other = sorted(stored - {current})
    if not other:
        return []
    return [
        f"some minutes of shared GPUs were split by the rule {', '.join(other)} (the rule in "
        f"force when they were rolled up); the rule now is {current}"
    ]


def job_summary(
    conn: Connection, *, settings: Settings, job: dict[str, Any], now: datetime
) -> dict[str, Any]:
    """The waste summary of one job over its lifetime: totals, per GPU, recommendations with
    their savings, and energy."""
    intervals = job["intervals"]
    gpu_ids = sorted({iv["gpu_id"] for iv in intervals})
    start = min([iv["started_at"] for iv in intervals], default=job["started_at"])
    ends = [iv["ended_at"] or job["ended_at"] or now for iv in intervals]
    end = min(max(ends, default=job["ended_at"] or now), now)
    per_gpu: dict[str, Summary] = {}
    total = Summary(job["id"])
    warnings: list[str] = []
    uses: list[GpuUse] = []
    prices: list[PriceRow] = []
    if gpu_ids and start < end:
        att = attribute(
            conn, settings=settings, start=start, end=end, now=now, gpu_ids=gpu_ids,
            cause_energy=True,
        )  # fmt: skip
        warnings = att.warnings
        prices = effective_prices(conn, settings).rows
        mine = [ln for ln in att.lines if ln.job_id == job["id"]]
        per_gpu = summarize(mine, lambda ln: att.gpus[ln.gpu_id].uuid)
        for summary in per_gpu.values():
            total.merge(summary)
        uses = _gpu_uses(conn, att, per_gpu, intervals, end=end)
        energy = _job_energy(conn, att, per_gpu, start=start, end=end, settings=settings)
    else:
        energy = _energy_dict(0.0, dict.fromkeys(diagnosis.CAUSE_NAMES, 0.0), "none", settings)
    assumptions = with_model(fix_assumptions_of(settings), [u.model for u in uses])
    fixes = recommend_job(total, uses, assumptions, prices=prices, when=end)
    return {
        "summary": report_row(total, settings, assumptions),
        "per_gpu": [
            {**report_row(summary, settings, assumptions), "gpu_uuid": uuid}
            for uuid, summary in sorted(per_gpu.items())
        ],
        "energy": energy,
        "recommendations": [f.as_dict() for f in fixes],
        "savings_usd": total_saving_usd(fixes) if total.priced else None,
        "faults": _with_lost_figures(
            job_faults(conn, job=job, now=now, prices=prices, settings=settings), per_gpu
        ),
        "warnings": warnings,
    }


Span = tuple[int, datetime, datetime]  # a GPU held over [start, end]


def report_faults(
    conn: Connection,
    att: Attribution,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    settings: Settings,
) -> dict[str, list[dict[str, Any]]]:
    """Each job's hardware faults in a report's window: the 1h rollups' XIDs up to two hours
    before its end, finer reads after; the jobs' intervals read only for GPUs with a fault."""
    hourly = end.replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    end = min(end, now)
    found = gpus_repo.gpu_faults(
        conn, gpu_ids=sorted(att.gpus), start=start, end=end, hourly_before=hourly
    )
    if not found:
        return {}
    allocations, _ = costs_repo.load_allocations(
        conn, start=start, end=end, now=now, gpu_ids=sorted({f.gpu_id for f in found})
    )
    spans_of: dict[str, list[Span]] = defaultdict(list)
    for al in allocations:
        spans_of[al.job_id].append((al.gpu_id, al.start, al.end))
    prices = effective_prices(conn, settings).rows
    return faults_of_jobs(conn, spans_of, prices=prices, settings=settings, hourly_before=hourly)


def _with_lost_figures(
    faults: list[dict[str, Any]], per_gpu: dict[str, Summary]
) -> list[dict[str, Any]]:
    """The faults with a lost GPU's seconds and USD those of the job's summary on that GPU (its
    held seconds no sample covers after ``lost_at``), so the page and the bill say one figure."""
    for f in faults:
        s = per_gpu.get(f["gpu_uuid"])
        if f["kind"] == "lost" and s is not None:
            f["lost_seconds"] = s.lost_seconds
            f["lost_usd"] = s.lost_usd if s.priced else None
    return faults


def job_faults(
    conn: Connection,
    *,
    job: dict[str, Any],
    now: datetime,
    prices: Sequence[PriceRow],
    settings: Settings,
) -> list[dict[str, Any]]:
    """The hardware faults of the job's GPUs while it held them: each hardware XID (node, GPU
    index, code, first time) and each GPU that fell off the bus (its last sample, when it was
    reported lost, and the seconds and USD the job held it lost: from ``lost_at``)."""
    spans = [(iv["gpu_id"], iv["started_at"], min(iv["ended_at"] or now, now))
             for iv in job["intervals"]]  # fmt: skip
    return faults_of_jobs(conn, {job["id"]: spans}, prices=prices, settings=settings).get(
        job["id"], []
    )


def faults_of_jobs(
    conn: Connection,
    spans_of: dict[str, list[Span]],
    *,
    prices: Sequence[PriceRow],
    settings: Settings,
    hourly_before: datetime | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Each job's hardware faults (see ``job_faults``) on the GPUs it held over its spans, read
    in one pass over the GPUs (``hourly_before`` as ``gpus_repo.gpu_faults`` has it)."""
    spans = [s for spans in spans_of.values() for s in spans]
    if not spans:
        return {}
    grace = timedelta(seconds=settings.max_gap_seconds)  # a last sample stands this long
    faults = gpus_repo.gpu_faults(
        conn,
        gpu_ids=sorted({g for g, _, _ in spans}),
        start=min(a for _, a, _ in spans),
        end=max(z for _, _, z in spans) + grace,
        hourly_before=hourly_before,
    )
    out: dict[str, list[dict[str, Any]]] = {}
    for f in faults:
        for job_id, mine in spans_of.items():
            held = [
                (a, z) for g, a, z in mine
                if g == f.gpu_id and f.at + timedelta(seconds=f.within_seconds) >= a
                and f.at <= z + grace
            ]  # fmt: skip
            if held:
                out.setdefault(job_id, []).append(_fault_row(conn, f, held, prices))
    return out


def _fault_row(
    conn: Connection,
    f: gpus_repo.GpuFault,
    held: list[tuple[datetime, datetime]],
    prices: Sequence[PriceRow],
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "gpu_uuid": f.uuid, "node": f.node, "gpu_index": f.gpu_index,
        "kind": "xid" if f.xid is not None else "lost", "xid": f.xid, "at": f.at,
        "lost_at": f.lost_at, "lost_seconds": None, "lost_usd": None,
    }  # fmt: skip
    if f.lost_at is not None:
        seconds = sum(max((z - max(a, f.lost_at)).total_seconds(), 0.0) for a, z in held)
        row["lost_seconds"] = seconds
        price = price_at(prices, _model_of(conn, f.gpu_id), f.lost_at) if prices else None
        row["lost_usd"] = None if price is None else seconds * price.usd_per_gpu_hour / 3600
    return row


def _model_of(conn: Connection, gpu_id: int) -> str:
    info = costs_repo.load_gpus(conn, gpu_ids=[gpu_id]).get(gpu_id)
    return info.model if info is not None else ""


# A counter reading whose mean power differs from the integrated power by more than this
# factor is not believed (a counter of another GPU, a reset missed): the power integral stays.
_COUNTER_PLAUSIBLE = 2.0
_COUNTER_MIN_SECONDS = 30.0  # readings closer than this say little about the mean power


def _job_energy(
    conn: Connection,
    att: Attribution,
    per_gpu: dict[str, Summary],
    *,
    start: datetime,
    end: datetime,
    settings: Settings,
) -> dict[str, Any]:
    """The job's energy: kWh, its cost, the part burned while nothing ran, and kWh per cause.

    Per GPU the power integrated over each cause's seconds, scaled to the GPU's energy counter
    where it has one: the counter's mean power between its first and last reading in the job
    over the integrated mean power (a counter misses no spike between two samples).
    """
    by_uuid = {info.uuid: info for info in att.gpus.values()}
    total = 0.0
    by_cause = dict.fromkeys(diagnosis.CAUSE_NAMES, 0.0)
    sources = set()
    counters = costs_repo.energy_counters(
        conn, gpu_ids=[by_uuid[uuid].id for uuid in per_gpu], start=start, end=end
    )
    for uuid, summary in per_gpu.items():
        u = summary.usage
        scale = 1.0
        source = "power"
        counter = counters.get(by_uuid[uuid].id)
        if counter and counter[1] >= _COUNTER_MIN_SECONDS and u.energy_used_joules > 0:
            ratio = (counter[0] / counter[1]) / (u.energy_used_joules / u.covered_seconds)
            if 1 / _COUNTER_PLAUSIBLE <= ratio <= _COUNTER_PLAUSIBLE:
                scale, source = ratio, "energy_counter"
        sources.add(source)
        total += scale * u.energy_used_joules
        for name, joules in u.cause_energy_joules().items():
            by_cause[name] += scale * joules
    source = sources.pop() if len(sources) == 1 else "mixed" if sources else "none"
    return _energy_dict(total, by_cause, source, settings)


def _energy_dict(
    joules: float, by_cause: dict[str, float], source: str, settings: Settings
) -> dict[str, Any]:
    rate = settings.energy_usd_per_kwh
    idle = (by_cause["idle_empty"] + by_cause["idle_held"]) / JOULES_PER_KWH
    return {
        "kwh": joules / JOULES_PER_KWH,
        "usd": joules / JOULES_PER_KWH * rate,
        "idle_kwh": idle,
        "idle_usd": idle * rate,
        "usd_per_kwh": rate,
        "source": source,
        "by_cause_kwh": {name: j / JOULES_PER_KWH for name, j in by_cause.items()},
    }


def _gpu_uses(
    conn: Connection,
    att: Attribution,
    per_gpu: dict[str, Summary],
    intervals: list[dict[str, Any]],
    *,
    end: datetime,
) -> list[GpuUse]:
    """Each GPU of the job with its model, memory size and the job's peaks on it: memory, DRAM
    activity, PCIe and NVLink rates (GPUs held over the same stretch are read together)."""
    by_uuid = {info.uuid: info for info in att.gpus.values()}
    totals = costs_repo.gpu_memory_totals(conn, gpu_ids=[info.id for info in by_uuid.values()])
    windows: dict[int, tuple[datetime, datetime]] = {}
    for iv in intervals:
        a, z = iv["started_at"], min(iv["ended_at"] or end, end)
        old = windows.get(iv["gpu_id"])
        windows[iv["gpu_id"]] = (min(a, old[0]), max(z, old[1])) if old else (a, z)
    by_window: dict[tuple[datetime, datetime], list[int]] = defaultdict(list)
    for gpu_id, window in windows.items():
        by_window[window].append(gpu_id)
    peaks: dict[int, dict[str, float]] = {}
    for (a, z), ids in by_window.items():
        if a < z:
            peaks.update(costs_repo.peak_usage(conn, gpu_ids=ids, start=a, end=z))
    out = []
    for uuid, summary in sorted(per_gpu.items()):
        info = by_uuid[uuid]
        total = totals.get(info.id)
        p = peaks.get(info.id, {})
        out.append(
            GpuUse(
                uuid, info.model, None if total is None else float(total),
                p.get("fb_used_bytes"), summary,
                peak_dram_active=p.get("dram_active"),
                peak_pcie_bytes_per_second=_busier(p, "pcie"),
                peak_nvlink_bytes_per_second=_busier(p, "nvlink"),
            )
        )  # fmt: skip
    return out


def _busier(peaks: dict[str, float], link: str) -> float | None:
    """The busier direction's peak rate of ``link`` (pcie, nvlink), None if neither reported."""
    rates = [peaks[k] for k in (f"{link}_tx_bytes_per_second", f"{link}_rx_bytes_per_second")
             if k in peaks]  # fmt: skip
    return max(rates) if rates else None


def job_waste_usd(
    conn: Connection, *, job_id: str, now: datetime, settings: Settings
) -> float | None:
    """The job's waste (waste_usd: idle + fixable, USD) so far; None if unknown or unpriced."""
    job = jobs_repo.get_job(conn, job_id=job_id)
    if job is None:
        return None
    value = job_summary(conn, settings=settings, job=job, now=now)["summary"]["waste_usd"]
    return None if value is None else float(value)


def job_verdict(
    conn: Connection, *, job_id: str, now: datetime, settings: Settings
) -> dict[str, Any] | None:
    """What a job alert says about the job so far: its cost and waste (idle + fixable USD), its
    top cause, that cause's fix and what it saves; None for an unknown job."""
    job = jobs_repo.get_job(conn, job_id=job_id)
    if job is None:
        return None
    summary = job_summary(conn, settings=settings, job=job, now=now)
    row = summary["summary"]
    cause = row["top_cause"]
    fixes = summary["recommendations"]
    fix = next((f for f in fixes if cause and f["cause"] == cause), fixes[0] if fixes else None)
    return {
        "cost_usd": row["cost_usd"],
        "waste_usd": row["waste_usd"],
        "idle_usd": row["idle_usd"],
        "fixable_usd": row["fixable_usd"],
        "top_cause": cause,
        "fix": fix["action"] if fix else None,
        "fix_saving_usd": fix["saving_usd"] if fix else None,
    }
