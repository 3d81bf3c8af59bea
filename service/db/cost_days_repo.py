"""The cost day sums (cost_gpu_1d, cost_job_1d) and their stale ranges (cost_day_dirty):
written by the cost-days job, read by cost reports over whole UTC days."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, delete, func, insert, or_, select

from service.db.schema import (
    cost_day_dirty,
    cost_gpu_1d,
    cost_job_1d,
    jobs,
)

DAY = timedelta(days=1)
UNALLOCATED_JOB = ""  # the job_id of a GPU's time no job held


def floor_day(ts: datetime) -> datetime:
    """The UTC midnight at or before ``ts``."""
    return ts.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def ceil_day(ts: datetime) -> datetime:
    """The UTC midnight at or after ``ts``."""
    floor = floor_day(ts)
    return floor if floor == ts else floor + DAY


def _utc(value: Any) -> datetime:
    """A timestamp read back (SQLite hands back text from aggregates)."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    parsed = datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


# --- stale ranges ---------------------------------------------------------------------------


def mark_minutes(conn: Connection, keys: Sequence[tuple[int, datetime]]) -> int:
    """Mark stale the summed days of the (GPU, minute) ``keys`` the rollup job recomputed (and
    the minutes after them a sample there covers); only GPUs with a summed day in that range get
    a row, so the usual round (today's minutes, not summed yet) writes none. Returns how many."""
    if not keys:
        return 0
    spans: dict[int, list[datetime]] = {}
    for gpu_id, minute in keys:
        lo_hi = spans.get(gpu_id)
        if lo_hi is None:
            spans[gpu_id] = [minute, minute]
        elif minute < lo_hi[0]:
            lo_hi[0] = minute
        elif minute > lo_hi[1]:
            lo_hi[1] = minute
    first = floor_day(min(lo for lo, _ in spans.values()))
    last = max(hi for _, hi in spans.values()) + timedelta(minutes=2)
    g = cost_gpu_1d.c
    summed: set[int] = set()
    ids = sorted(spans)
    for i in range(0, len(ids), 1000):
        summed |= {
            int(gpu_id)
            for (gpu_id,) in conn.execute(
                select(g.gpu_id)
                .where(g.day >= first, g.day < last, g.gpu_id.in_(ids[i : i + 1000]))
                .distinct()
            )
        }
    rows = [
        {"gpu_id": gpu_id, "lo": floor_day(lo), "hi": hi + timedelta(minutes=2)}
        for gpu_id, (lo, hi) in spans.items()
        if gpu_id in summed
    ]
    if rows:
        conn.execute(insert(cost_day_dirty), rows)
    return len(rows)


def stale_ranges(conn: Connection) -> list[tuple[int, int, datetime | None, datetime | None]]:
    """Every stale range: (id, GPU id, lo, hi), None for unbounded."""
    c = cost_day_dirty.c
    return [
        (int(i), int(g), None if lo is None else _utc(lo), None if hi is None else _utc(hi))
        for i, g, lo, hi in conn.execute(select(c.id, c.gpu_id, c.lo, c.hi).order_by(c.id))
    ]


def forget_ranges(conn: Connection, ids: Sequence[int]) -> None:
    """Delete the stale ranges ``ids`` (those a round read; newer ones stay)."""
    for i in range(0, len(ids), 1000):
        conn.execute(delete(cost_day_dirty).where(cost_day_dirty.c.id.in_(ids[i : i + 1000])))


def stale_gpus(conn: Connection, *, start: datetime, end: datetime) -> set[int]:
    """The GPUs with a stale range overlapping [start, end)."""
    c = cost_day_dirty.c
    query = select(c.gpu_id).where(
        or_(c.lo.is_(None), c.lo < end), or_(c.hi.is_(None), c.hi > start)
    )
    return {int(g) for (g,) in conn.execute(query.distinct())}


# --- coverage -------------------------------------------------------------------------------


def coverage(
    conn: Connection, *, start: datetime, end: datetime, basis: str
) -> dict[int, tuple[int, float]]:
    """Per GPU, how many of the days in [start, end) are summed under ``basis`` and their
    unpriced seconds."""
    g = cost_gpu_1d.c
    query = (
        select(g.gpu_id, func.count(), func.sum(g.unpriced_seconds))
        .where(g.day >= start, g.day < end, g.basis == basis)
        .group_by(g.gpu_id)
    )
    return {int(gpu): (int(n), float(u or 0.0)) for gpu, n, u in conn.execute(query)}


def partial_days(
    conn: Connection, *, start: datetime, end: datetime, basis: str
) -> list[tuple[int, datetime, datetime | None, datetime | None]]:
    """The summed days in [start, end) that the GPU held only in part: (GPU id, day,
    held_from, held_until), None where it held the day from midnight or to the next."""
    g = cost_gpu_1d.c
    query = select(g.gpu_id, g.day, g.held_from, g.held_until).where(
        g.day >= start,
        g.day < end,
        g.basis == basis,
        or_(g.held_from.is_not(None), g.held_until.is_not(None)),
    )
    return [
        (int(gpu), _utc(day), None if a is None else _utc(a), None if b is None else _utc(b))
        for gpu, day, a, b in conn.execute(query)
    ]


def day_counts(conn: Connection, *, since: datetime, basis: str) -> dict[datetime, int]:
    """Per day from ``since``, how many GPUs are summed under ``basis``."""
    g = cost_gpu_1d.c
    query = select(g.day, func.count()).where(g.day >= since, g.basis == basis).group_by(g.day)
    return {_utc(day): int(n) for day, n in conn.execute(query)}


def summed_gpus(
    conn: Connection, *, day: datetime, basis: str
) -> dict[int, tuple[datetime | None, datetime | None]]:
    """The GPUs summed for ``day`` under ``basis``, with their held_from and held_until."""
    g = cost_gpu_1d.c
    query = select(g.gpu_id, g.held_from, g.held_until).where(g.day == day, g.basis == basis)
    return {
        int(gpu): (None if a is None else _utc(a), None if b is None else _utc(b))
        for gpu, a, b in conn.execute(query)
    }


# --- reads for a report ---------------------------------------------------------------------


def _within(table: Any, start: datetime, end: datetime, excluded: Iterable[int]) -> list[Any]:
    c = table.c
    cond = [c.day >= start, c.day < end]
    left_out = sorted(excluded)
    if left_out:
        cond.append(c.gpu_id.not_in(left_out))
    return cond


def job_sums(
    conn: Connection,
    *,
    start: datetime,
    end: datetime,
    excluded: Iterable[int],
    fields: Sequence[str],
) -> list[tuple[Any, ...]]:
    """Per job ("" for no job) over the days in [start, end), GPUs ``excluded`` left out:
    (job id, user, team, project, the sums of ``fields``)."""
    j = cost_job_1d.c
    query = (
        select(
            j.job_id, jobs.c.user, jobs.c.team, jobs.c.project, *(func.sum(j[f]) for f in fields)
        )
        .select_from(cost_job_1d.outerjoin(jobs, jobs.c.id == j.job_id))
        .where(*_within(cost_job_1d, start, end, excluded))
        .group_by(j.job_id, jobs.c.user, jobs.c.team, jobs.c.project)
    )
    return [tuple(row) for row in conn.execute(query)]


def gpu_sums(
    conn: Connection,
    *,
    start: datetime,
    end: datetime,
    excluded: Iterable[int],
    fields: Sequence[str],
) -> list[tuple[Any, ...]]:
    """Per GPU over the days in [start, end), GPUs ``excluded`` left out: (GPU id, sums)."""
    g = cost_gpu_1d.c
    query = (
        select(g.gpu_id, *(func.sum(g[f]) for f in fields))
        .where(*_within(cost_gpu_1d, start, end, excluded))
        .group_by(g.gpu_id)
    )
    return [tuple(row) for row in conn.execute(query)]


def job_gpu_pairs(
    conn: Connection, *, start: datetime, end: datetime, excluded: Iterable[int]
) -> list[tuple[str, int]]:
    """The distinct (job id, GPU id) of the days in [start, end) ("" for no job)."""
    j = cost_job_1d.c
    query = (
        select(j.job_id, j.gpu_id)
        .where(*_within(cost_job_1d, start, end, excluded))
        .group_by(j.job_id, j.gpu_id)
    )
    return [(str(job), int(gpu)) for job, gpu in conn.execute(query)]


# --- writes ---------------------------------------------------------------------------------


def replace_days(
    conn: Connection,
    *,
    keys: Sequence[tuple[int, datetime]],
    gpu_rows: Sequence[dict[str, Any]],
    job_rows: Sequence[dict[str, Any]],
) -> None:
    """Replace the sums of the (GPU id, day) ``keys`` with these rows."""
    by_day: dict[datetime, list[int]] = defaultdict(list)
    for gpu_id, day in keys:
        by_day[day].append(gpu_id)
    for day, ids in by_day.items():
        for i in range(0, len(ids), 1000):
            chunk = ids[i : i + 1000]
            for table in (cost_gpu_1d, cost_job_1d):
                conn.execute(
                    delete(table).where(and_(table.c.day == day, table.c.gpu_id.in_(chunk)))
                )
    for table, rows in ((cost_gpu_1d, gpu_rows), (cost_job_1d, job_rows)):
        for i in range(0, len(rows), 2000):
            conn.execute(insert(table), list(rows[i : i + 2000]))


def delete_days_before(conn: Connection, *, cutoff: datetime) -> int:
    """Delete the sums of days before ``cutoff``; returns how many GPU-day rows."""
    n = conn.execute(delete(cost_gpu_1d).where(cost_gpu_1d.c.day < cutoff)).rowcount
    conn.execute(delete(cost_job_1d).where(cost_job_1d.c.day < cutoff))
    return int(n or 0)


def take_write_lock(conn: Connection) -> None:
    """On SQLite, take the write lock at the start of the transaction: one that read before
    another writer committed could not write after it. (On PostgreSQL the job runs on one
    replica at a time, and rows are replaced by key.)"""
    if conn.dialect.name == "sqlite":
        conn.execute(delete(cost_day_dirty).where(cost_day_dirty.c.id < 0))
