"""The cost day sums as a report reads them: which GPUs' whole days are summed and current, and
their figures as Summaries (the rows themselves are written by ``costing.cost_days``).

A (GPU, day) is read from the sums when its row carries the current ``basis`` (the price table
and the settings it was priced and integrated with), it covers the part of the day the GPU is
held now, and no stale range overlaps it; every other GPU-day is read from finer data, so a
report is the same whether or not its days were summed.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from operator import itemgetter
from typing import Any

from sqlalchemy import Connection

from service.core.buckets import DAY, ceil_day, floor_day
from service.core.diagnosis import CAUSE_NAMES
from service.costs.integrals import CAUSE_ENERGY_FIELDS, CAUSE_FIELDS
from service.costs.paging import FIXABLE_AT, IDLE_AT, Dollars
from service.costs.prices import PriceRow
from service.costs.waste import HARDWARE_GROUP_BYS, UNALLOCATED, USAGE_FIELDS, Summary, Usage
from service.db.costing import cost_days_reads, cost_days_repo
from service.db.costing.costs_repo import GpuInfo
from service.db.schema import COST_SUM_FIELDS
from service.roles import JobScope
from service.settings import Settings

UNKNOWN = "__unknown__"  # a job without the user or team a report groups by
_CAUSE_USD = tuple(f"{name}_usd" for name in CAUSE_NAMES)
_IDLE_USD = tuple(_CAUSE_USD[i] for i in IDLE_AT)
_FIXABLE_USD = tuple(_CAUSE_USD[i] for i in FIXABLE_AT)
# What a report reads of a row: all but the energy per cause, which no report row shows.
REPORT_FIELDS: tuple[str, ...] = tuple(f for f in COST_SUM_FIELDS if f not in CAUSE_ENERGY_FIELDS)
_USAGE = frozenset(USAGE_FIELDS)
assert len(_CAUSE_USD) == len(CAUSE_FIELDS)


@dataclass(frozen=True, slots=True)
class Who:
    """Whose time counts: jobs of ``user`` and ``team`` where given, those ``scope`` allows
    where given, any job's with ``jobs_only`` (else time no job held counts too)."""

    user: str | None = None
    team: str | None = None
    jobs_only: bool = False
    scope: JobScope | None = None

    @property
    def everyone(self) -> bool:
        """Whether no filter of jobs drops any time (``jobs_only`` aside)."""
        return self.user is None and self.team is None and self.scope is None


EVERYONE = Who()


def basis_of(prices: Sequence[PriceRow], settings: Settings) -> str:
    """A digest of what a day's figures depend on besides the stored data: the price table,
    the gap a sample covers at most and the split rule; rows under another basis are stale."""
    text = repr(
        (
            sorted(
                (p.model_pattern, p.usd_per_gpu_hour, p.effective_from.isoformat()) for p in prices
            ),
            settings.max_gap_seconds,
            settings.cost_split_rule,
        )
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def held_range(
    info: GpuInfo, day: datetime, until: datetime | None = None
) -> tuple[datetime, datetime] | None:
    """The part [from, until) of ``day`` that the report counts the GPU as held (only up to
    ``until`` where given: today so far), None if none."""
    held_from = max(day, info.known_from)
    held_until = min(day + DAY, until) if until is not None else day + DAY
    if info.retired_at is not None:
        held_until = min(held_until, info.retired_at)
    return (held_from, held_until) if held_from < held_until else None


def stored_bounds(
    held: tuple[datetime, datetime], day: datetime
) -> tuple[datetime | None, datetime | None]:
    """The held_from and held_until a row stores: None where the day is held from midnight or
    to the next."""
    a, b = held
    return (a if a > day else None, b if b < day + DAY else None)


def summary_row(summary: Summary) -> dict[str, Any]:
    """A summary's figures as the columns of COST_SUM_FIELDS."""
    row: dict[str, Any] = {
        "held_seconds": summary.held_seconds,
        "nodata_seconds": summary.nodata_seconds,
        "lost_seconds": summary.lost_seconds,
        "unpriced_seconds": summary.unpriced_seconds,
        "cost_usd": summary.cost_usd,
        "nodata_usd": summary.nodata_usd,
        "lost_usd": summary.lost_usd,
    }
    row.update(zip(_CAUSE_USD, summary.cause_cost_usd, strict=True))
    usage = summary.usage
    row.update({name: getattr(usage, name) for name in USAGE_FIELDS})
    return row


def summary_from(key: str, fields: Sequence[str], values: Sequence[Any]) -> Summary:
    """A Summary keyed ``key`` from the sums of ``fields`` (a subset of COST_SUM_FIELDS)."""
    if len(values) != len(fields):
        raise ValueError(f"{len(values)} values for {len(fields)} fields")
    plan = _plan_of(tuple(fields))
    # A trailing 0.0 is the value of every field not read (index -1); NULL sums read as 0.
    v = (*values, 0.0) if None not in values else (*(x or 0.0 for x in values), 0.0)
    s = Summary(key, usage=Usage(*plan.usage(v)), cause_cost_usd=list(plan.cause_usd(v)))
    for name, i in plan.scalars:
        setattr(s, name, v[i])
    return s


@dataclass(frozen=True, slots=True)
class _Plan:
    """Where each part of a Summary sits in a row of ``fields``: getters of the usage fields
    and of the causes' USD (index -1: not read), and (attribute, index) for the summary's own
    figures."""

    usage: Callable[[Sequence[float]], tuple[float, ...]]
    cause_usd: Callable[[Sequence[float]], tuple[float, ...]]
    scalars: tuple[tuple[str, int], ...]


@lru_cache(maxsize=8)
def _plan_of(fields: tuple[str, ...]) -> _Plan:
    """The plan of a row of ``fields``: worked out once, since a report builds a Summary per
    row (tens of thousands by job)."""
    at = {name: i for i, name in enumerate(fields)}
    return _Plan(
        usage=itemgetter(*(at.get(name, -1) for name in USAGE_FIELDS)),
        cause_usd=itemgetter(*(at.get(name, -1) for name in _CAUSE_USD)),
        scalars=tuple(
            (name, i) for name, i in at.items() if name not in _USAGE and name not in _CAUSE_INDEX
        ),
    )


_CAUSE_INDEX = {name: i for i, name in enumerate(_CAUSE_USD)}


@dataclass(slots=True)
class DaySums:
    """The summed whole days of a report's ``DayWindow``, already grouped as the report groups
    (``UNALLOCATED`` for time no job held; per GPU id when grouping by hardware), with the
    owner fields of each job when grouping by job."""

    groups: dict[str, Summary] = field(default_factory=dict)
    by_gpu: dict[int, Summary] = field(default_factory=dict)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)


def whole_days(start: datetime, end: datetime) -> tuple[datetime, datetime] | None:
    """The whole UTC days inside [start, end), None if there is none."""
    d0, d1 = ceil_day(start), floor_day(end)
    return (d0, d1) if d0 < d1 else None


def stale_in(
    conn: Connection,
    *,
    gpus: dict[int, GpuInfo],
    start: datetime,
    end: datetime,
    basis: str,
) -> tuple[set[int], set[int]]:
    """The GPUs whose days in [start, end) cannot all be read from the sums (a day not summed
    under ``basis``, summed for another held part of the day, or under a stale range), and the
    GPUs whose summed days have unpriced seconds. ``end`` is midnight, or the end of today's
    sums (``today_until``): then the last day is summed up to it."""
    have = cost_days_repo.coverage(conn, start=start, end=end, basis=basis)
    stale = cost_days_repo.stale_gpus(conn, start=start, end=end)
    partial = {
        (gpu_id, day): (a, b)
        for gpu_id, day, a, b in cost_days_repo.partial_days(
            conn, start=start, end=end, basis=basis
        )
    }
    days = math.ceil((end - start) / DAY)
    today = floor_day(end) if end != floor_day(end) else None
    for gpu_id, info in gpus.items():
        if info.known_from <= start and (info.retired_at is None or info.retired_at >= end):
            # Held every second of the window (the usual GPU): every day, whole but today.
            if have.get(gpu_id, (0, 0.0))[0] != days:
                stale.add(gpu_id)
            if today is not None and partial.pop((gpu_id, today), None) != (None, end):
                stale.add(gpu_id)
            continue
        n_days = 0
        # Only the days from the GPU's first to its retirement can hold it.
        day = max(start, floor_day(info.known_from))
        last = end if info.retired_at is None else min(end, info.retired_at)
        while day < last:
            held = held_range(info, day, end)
            if held is not None:
                n_days += 1
                bounds = stored_bounds(held, day)
                if partial.pop((gpu_id, day), (None, None)) != bounds:
                    stale.add(gpu_id)
            day += DAY
        if have.get(gpu_id, (0, 0.0))[0] != n_days:
            stale.add(gpu_id)
    # A partial day left over was summed for a part the GPU does not hold now; a GPU in the
    # sums but no longer known (deleted) is left out, never counted.
    stale |= {gpu_id for gpu_id, _ in partial} | (set(have) - set(gpus))
    return stale, {g for g, (_, unpriced) in have.items() if unpriced > 0}


def today_lag_seconds(settings: Settings) -> float:
    """How old today's sums may be for a report reaching the present to end where they end:
    their settling time plus three rounds of the cost-days job."""
    return settings.cost_today_settle_seconds + 3 * settings.cost_days_interval_seconds


def today_until(
    conn: Connection, *, start: datetime, end: datetime, now: datetime, basis: str,
    settings: Settings,
) -> datetime | None:  # fmt: skip
    """Where a report over [start, end) ends when it reads today from the sums of today so
    far: the instant they were summed up to, if the window covers today from midnight on and
    reaches past that instant, and they are at most ``today_lag_seconds`` old; else None."""
    today = floor_day(now)
    if start > today or end < now - timedelta(seconds=today_lag_seconds(settings)):
        return None
    until = cost_days_repo.summed_until(conn, day=today, basis=basis)
    if until is None or until > end or (now - until).total_seconds() > today_lag_seconds(settings):
        return None
    return until


@dataclass(frozen=True, slots=True)
class DayWindow:
    """The UTC days [start, end) a report reads from the day sums, for every GPU but
    ``excluded`` (read from finer data): whole days, and today up to ``end`` where the report
    ends where today's sums do (``today_until``)."""

    start: datetime
    end: datetime
    excluded: frozenset[int]

    @property
    def report_end(self) -> datetime | None:
        """Where the report ends instead of the end asked (today's sums' end), None if not."""
        return self.end if self.end != floor_day(self.end) else None


def read_dollars(
    conn: Connection,
    window: DayWindow,
    *,
    who: Who = EVERYONE,
) -> dict[str, Dollars]:
    """Per job of those ``who`` counts (``UNALLOCATED`` for time no job held, where it counts
    that), the dollars of its summed days in ``window`` that bound its
    place in a report."""
    rows = cost_days_reads.job_dollars(
        conn, start=window.start, end=window.end, excluded=window.excluded,
        idle_fields=_IDLE_USD, fixable_fields=_FIXABLE_USD, user=who.user, team=who.team,
        jobs_only=who.jobs_only, scope=who.scope,
    )  # fmt: skip
    return {
        UNALLOCATED if job_id == cost_days_repo.UNALLOCATED_JOB else job_id: Dollars(
            idle, fixable, cost, unpriced == 0
        )
        for job_id, idle, fixable, cost, unpriced in rows
    }


def read_total(
    conn: Connection,
    window: DayWindow,
    *,
    who: Who = EVERYONE,
) -> Summary:
    """The sum of the summed days in ``window`` of the time ``who`` counts, with its GPUs;
    its job ids are left to the caller."""
    fields = REPORT_FIELDS
    gpu_ids, values = cost_days_reads.total_sums(
        conn, start=window.start, end=window.end, excluded=window.excluded, fields=fields,
        user=who.user, team=who.team, jobs_only=who.jobs_only, scope=who.scope,
    )  # fmt: skip
    total = summary_from("__total__", fields, values)
    total.gpu_ids.update(gpu_ids)
    return total


def read_days(
    conn: Connection,
    window: DayWindow,
    *,
    group_by: str,
    who: Who = EVERYONE,
    job_ids: Collection[str] | None = None,
) -> DaySums:
    """The sums of the days of ``window``, grouped in the database: per GPU when grouping by
    hardware, else by ``group_by`` of the jobs as they are now (only the time ``who``
    counts: any filter of jobs drops time no job held as ``jobs_only`` does; only the
    jobs ``job_ids`` if given, ``UNALLOCATED`` among them for time no job held)."""
    start, end, excluded = window.start, window.end, window.excluded
    out = DaySums()
    fields = REPORT_FIELDS
    if group_by in HARDWARE_GROUP_BYS:
        for gpu_id, job_ids, values in cost_days_reads.gpu_sums(
            conn, start=start, end=end, excluded=excluded, fields=fields
        ):
            s = out.by_gpu[gpu_id] = summary_from(str(gpu_id), fields, values)
            s.gpu_ids.add(gpu_id)
            s.job_ids.update(job_ids)
        return out
    filtered = not who.everyone or who.jobs_only
    only = None if job_ids is None else [
        cost_days_repo.UNALLOCATED_JOB if k == UNALLOCATED else k for k in job_ids
    ]  # fmt: skip
    for no_job, key, owner, gpu_ids, ids, values in cost_days_reads.group_sums(
        conn, start=start, end=end, excluded=excluded, fields=fields, group_by=group_by,
        user=who.user, team=who.team, jobs_only=who.jobs_only, job_ids=only, scope=who.scope,
    ):  # fmt: skip
        if no_job and filtered:
            continue
        name = UNALLOCATED if no_job else (key or UNKNOWN)
        s = summary_from(name, fields, values)
        s.gpu_ids.update(gpu_ids)
        s.job_ids.update(ids)
        group = out.groups.get(name)
        if group is None:
            out.groups[name] = s
        else:
            group.merge(s)
        if group_by == "job" and not no_job and key is not None:
            out.jobs[key] = {"id": key, **owner}
    return out


def read_team_gpus(conn: Connection, window: DayWindow) -> dict[tuple[str, int], Summary]:
    """The sums of the days of ``window`` per (team, GPU id), of the jobs with a team."""
    fields = REPORT_FIELDS
    out: dict[tuple[str, int], Summary] = {}
    for team, gpu_id, values in cost_days_reads.team_gpu_sums(
        conn, start=window.start, end=window.end, excluded=window.excluded, fields=fields
    ):
        if team:
            s = out[(team, gpu_id)] = summary_from(team, fields, values)
            s.gpu_ids.add(gpu_id)
    return out
