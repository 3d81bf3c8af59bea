"""The cost-days job: writes each (job, GPU, UTC day)'s and (GPU, day)'s figures, priced, for
every whole day that is missing, stale or priced under another basis, newest day first.

A day's figures are the cost report's own lines for [day, day + 1 day) (``attribute`` with
edges read from raw samples), summed per job and per GPU, so a report reading them equals one
reading the same days from the rollups.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine

from service.core.buckets import DAY, ceil_day, floor_day, floor_minute
from service.costs.waste import Summary
from service.db.costing import cost_days_repo, costs_repo
from service.db.costing.cost_days_repo import UNALLOCATED_JOB
from service.settings import Settings
from service.usecases.costing.attribution import attribute
from service.usecases.costing.day_sums import (
    basis_of,
    held_range,
    stored_bounds,
    summary_row,
    today_lag_seconds,
)
from service.usecases.price_table import effective_prices

Key = tuple[int, datetime]  # (GPU id, day)


def _expected(
    gpus: dict[int, costs_repo.GpuInfo], since: datetime, today: datetime
) -> tuple[dict[datetime, int], dict[Key, tuple[datetime | None, datetime | None]]]:
    """How many GPUs each day in [since, today) holds, and the days held only in part with
    the bounds their rows store."""
    counts: dict[datetime, int] = defaultdict(int)
    partial: dict[Key, tuple[datetime | None, datetime | None]] = {}
    for gpu_id, info in gpus.items():
        day = max(floor_day(info.known_from), since)
        last = today if info.retired_at is None else min(ceil_day(info.retired_at), today)
        while day < last:
            held = held_range(info, day)
            if held is not None:
                counts[day] += 1
                bounds = stored_bounds(held, day)
                if bounds != (None, None):
                    partial[(gpu_id, day)] = bounds
            day += DAY
    return counts, partial


def _todo(
    conn: Connection, *, gpus: dict[int, costs_repo.GpuInfo], since: datetime, today: datetime,
    basis: str,
) -> tuple[set[Key], set[Key], list[int]]:  # fmt: skip
    """The (GPU, day) keys to write: (those a stale range covers, those missing or summed
    for another held part of the day), and the ids of the stale ranges read."""
    ranges = cost_days_repo.stale_ranges(conn)
    stale: set[Key] = set()
    for _, gpu_id, lo, hi in ranges:
        day = max(floor_day(lo) if lo is not None else since, since)
        last = min(ceil_day(hi) if hi is not None else today, today)
        while day < last:
            stale.add((gpu_id, day))
            day += DAY
    expected, partial = _expected(gpus, since, today)
    summed_partial = {
        (g, d): (a, b)
        for g, d, a, b in cost_days_repo.partial_days(conn, start=since, end=today, basis=basis)
    }
    missing = {k for k, bounds in partial.items() if summed_partial.get(k) != bounds}
    missing |= {k for k in summed_partial if k not in partial}
    counts = cost_days_repo.day_counts(conn, since=since, until=today, basis=basis)
    for day in sorted(set(expected) | set(counts)):
        if counts.get(day, 0) == expected.get(day, 0):
            continue
        summed = cost_days_repo.summed_gpus(conn, day=day, basis=basis)
        held = {g for g, info in gpus.items() if held_range(info, day) is not None}
        # Missing, and summed for a day the GPU no longer holds (its rows replaced by none).
        missing |= {(g, day) for g in held ^ set(summed)}
    return stale, missing, [i for i, _, _, _ in ranges]


def _rows(
    conn: Connection, *, settings: Settings, gpus: dict[int, costs_repo.GpuInfo], day: datetime,
    gpu_ids: list[int] | None, now: datetime, basis: str, until: datetime | None = None,
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:  # fmt: skip
    """The cost_gpu_1d and cost_job_1d rows of ``gpu_ids`` (None: every GPU) for ``day``, or
    for its part up to ``until`` (today so far)."""
    wanted = gpus if gpu_ids is None else [g for g in gpu_ids if g in gpus]
    held = {g: h for g in wanted if (h := held_range(gpus[g], day, until)) is not None}
    if not held:
        return [], []
    att = attribute(
        conn, settings=settings, start=day, end=until or day + DAY, now=now,
        gpu_ids=None if len(held) == len(gpus) else sorted(held), raw_edges=True,
        cause_energy=True, gpu_info=gpus,
    )  # fmt: skip
    per_gpu: dict[int, Summary] = {}
    per_job: dict[tuple[int, str], Summary] = {}
    for line in att.lines:
        job = line.job_id or UNALLOCATED_JOB
        # A Summary built only where none is yet (setdefault would build one per line).
        gpu_sum = per_gpu.get(line.gpu_id)
        if gpu_sum is None:
            gpu_sum = per_gpu[line.gpu_id] = Summary("")
        gpu_sum.add_line(line)
        job_sum = per_job.get((line.gpu_id, job))
        if job_sum is None:
            job_sum = per_job[(line.gpu_id, job)] = Summary(job)
        job_sum.add_line(line)
    gpu_rows: list[dict[str, object]] = []
    for gpu_id, bounds in held.items():
        held_from, held_until = stored_bounds(bounds, day)
        row = summary_row(per_gpu.get(gpu_id) or Summary(""))
        row.update(gpu_id=gpu_id, day=day, basis=basis, held_from=held_from,
                   held_until=held_until, written_at=now)  # fmt: skip
        gpu_rows.append(row)
    job_rows = [
        {**summary_row(s), "day": day, "gpu_id": gpu_id, "job_id": job}
        for (gpu_id, job), s in per_job.items()
    ]
    return gpu_rows, job_rows


# GPU-days a transaction writes at most: SQLite has one writer, so there its transactions stay
# short (agents' batches wait for them).
MAX_GPU_DAYS = {"sqlite": 100, "postgresql": 2000}


def write_round(conn: Connection, *, settings: Settings, now: datetime) -> int | None:
    """Write every stale (GPU, day) and up to ``MAX_GPU_DAYS`` missing ones (newest day
    first) in this transaction; returns how many GPU-days, None when nothing is left to write."""
    cost_days_repo.take_write_lock(conn)
    today = floor_day(now)
    since = today - timedelta(days=settings.cost_days_backfill_days)
    basis = basis_of(effective_prices(conn, settings).rows, settings)
    gpus = costs_repo.load_gpus(conn)
    stale, missing, range_ids = _todo(conn, gpus=gpus, since=since, today=today, basis=basis)
    limit = MAX_GPU_DAYS.get(conn.dialect.name, 2000)
    keys = stale | set(sorted(missing, key=lambda k: (-k[1].timestamp(), k[0]))[:limit])
    if not keys and not range_ids:
        return None
    by_day: dict[datetime, list[int]] = defaultdict(list)
    for gpu_id, day in keys:
        by_day[day].append(gpu_id)
    gpu_rows: list[dict[str, object]] = []
    job_rows: list[dict[str, object]] = []
    for day, ids in sorted(by_day.items()):
        g_rows, j_rows = _rows(
            conn, settings=settings, gpus=gpus, day=day, gpu_ids=ids, now=now, basis=basis
        )
        gpu_rows += g_rows
        job_rows += j_rows
    cost_days_repo.replace_days(conn, keys=sorted(keys), gpu_rows=gpu_rows, job_rows=job_rows)
    cost_days_repo.forget_ranges(conn, range_ids)
    return len(keys)


def write_today(conn: Connection, *, settings: Settings, now: datetime) -> int:
    """In a fleet of ``cost_today_min_gpus`` or more, replace today's sums with those of today
    up to a whole minute ``cost_today_settle_seconds`` old; returns how many GPUs' rows."""
    cost_days_repo.take_write_lock(conn)
    gpus = costs_repo.load_gpus(conn)
    today = floor_day(now)
    until = floor_minute(now - timedelta(seconds=settings.cost_today_settle_seconds))
    if len(gpus) < settings.cost_today_min_gpus or until <= today:
        return 0
    basis = basis_of(effective_prices(conn, settings).rows, settings)
    # Late samples of today seen so far are in the rows written now: their stale marks go
    # with them (else the GPUs they mark are read from minutes until the next round).
    covered = [i for i, _, lo, _ in cost_days_repo.stale_ranges(conn) if lo and lo >= today]
    gpu_rows, job_rows = _rows(
        conn, settings=settings, gpus=gpus, day=today, gpu_ids=None, now=now, basis=basis,
        until=until,
    )  # fmt: skip
    cost_days_repo.replace_day(conn, day=today, gpu_rows=gpu_rows, job_rows=job_rows)
    cost_days_repo.forget_ranges(conn, covered)
    return len(gpu_rows)


# The share of today's GPUs read from finer data (not summed, or marked stale) at which
# today's sums are written again before the cost-days job's next run.
TODAY_UNSUMMED_SHARE = 0.1


def today_stale(conn: Connection, *, settings: Settings, now: datetime) -> bool:
    """Whether today's sums are missing, so old that a report would stop reading them before
    the next check (a rollup interval away), or leave a tenth of the GPUs with samples today
    to finer data (a fleet summed while its batches still arrive). Until they are written
    again every page that reaches today reads those GPUs' today from the minute rollups."""
    basis = basis_of(effective_prices(conn, settings).rows, settings)
    today = floor_day(now)
    until = cost_days_repo.summed_until(conn, day=today, basis=basis)
    fresh_for = today_lag_seconds(settings) - settings.rollup_interval_seconds
    if until is None or (now - until).total_seconds() > fresh_for:
        return True
    unsummed = cost_days_repo.today_unsummed(conn, day=today, until=until, basis=basis)
    summed = cost_days_repo.day_counts(conn, since=today, until=today + DAY, basis=basis)
    return unsummed >= TODAY_UNSUMMED_SHARE * (sum(summed.values()) + unsummed)


def write_today_if_stale(
    engine: Engine, *, settings: Settings, clock: Callable[[], datetime]
) -> int:
    """``write_today`` where ``today_stale`` says so; returns how many GPUs' rows (0 where
    they were current). The check only reads, so SQLite's writers are not held for it."""
    with engine.connect() as conn:
        if not today_stale(conn, settings=settings, now=clock()):
            return 0
    with engine.begin() as conn:
        return write_today(conn, settings=settings, now=clock())


def write_days(
    engine: Engine,
    *,
    settings: Settings,
    clock: Callable[[], datetime],
    budget_seconds: float = 10.0,
) -> int:
    """Run ``write_round`` transaction after transaction until nothing is left to write or
    ``budget_seconds`` have passed, then ``write_today``; returns how many GPU-days were
    written (today's rows not counted)."""
    started = time.monotonic()
    total = 0
    while time.monotonic() - started < budget_seconds:
        with engine.begin() as conn:
            n = write_round(conn, settings=settings, now=clock())
        if n is None:
            break
        total += n
    with engine.begin() as conn:
        write_today(conn, settings=settings, now=clock())
    return total


def prune(conn: Connection, *, settings: Settings, now: datetime) -> int:
    """Delete the day sums older than the 1h rollups' retention; returns how many GPU-days."""
    return cost_days_repo.delete_days_before(
        conn, cutoff=floor_day(now - timedelta(days=settings.retention_1h_days))
    )
