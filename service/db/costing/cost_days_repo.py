"""The cost day sums (cost_gpu_1d, cost_job_1d) and their stale ranges (cost_day_dirty):
written by the cost-days job, read by cost reports over whole UTC days."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    Text,
    and_,
    cast,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
)

from service.core.buckets import floor_day
from service.db.cost_scratch import load_rows
from service.db.schema import (
    COST_SUM_FIELDS,
    cost_day_dirty,
    cost_gpu_1d,
    cost_job_1d,
    cost_job_day_1d,
    gpus,
)

UNALLOCATED_JOB = ""  # the job_id of a GPU's time no job held


def _utc(value: Any) -> datetime:
    """A timestamp read back (SQLite hands back text from aggregates)."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    parsed = datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


# --- stale ranges ---------------------------------------------------------------------------


def mark_minutes(conn: Connection, keys: Sequence[tuple[int, datetime]]) -> int:
    """Mark stale the summed days of the (GPU, minute) ``keys`` the rollup job recomputed (and
    the minutes after them a sample there covers); only GPUs with a summed part of a day in
    that range get a row, so the usual round (minutes after today's sums end) writes none.
    Returns how many."""
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
        query = select(g.gpu_id, g.held_until).where(
            g.day >= first, g.day < last, g.gpu_id.in_(ids[i : i + 1000])
        )
        # Today is summed only up to a few minutes ago: the minutes after that are not in it.
        summed |= {
            int(gpu_id)
            for gpu_id, until in conn.execute(query)
            if until is None or _utc(until) > spans[int(gpu_id)][0]
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


def today_unsummed(conn: Connection, *, day: datetime, until: datetime, basis: str) -> int:
    """How many GPUs with samples since ``day`` (today) its sums up to ``until`` leave to be
    read from finer data: none summed, or marked stale before ``until``."""
    g = cost_gpu_1d.c
    summed = select(g.gpu_id).where(g.day == day, g.basis == basis)
    sampled = select(gpus.c.id).where(gpus.c.last_sample_at >= day)
    missing = select(func.count()).select_from(sampled.where(gpus.c.id.not_in(summed)).subquery())
    return int(conn.execute(missing).scalar_one()) + len(stale_gpus(conn, start=day, end=until))


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


def day_counts(
    conn: Connection, *, since: datetime, until: datetime, basis: str
) -> dict[datetime, int]:
    """Per day in [since, until), how many GPUs are summed under ``basis``."""
    g = cost_gpu_1d.c
    query = (
        select(g.day, func.count())
        .where(g.day >= since, g.day < until, g.basis == basis)
        .group_by(g.day)
    )
    return {_utc(day): int(n) for day, n in conn.execute(query)}


def summed_until(conn: Connection, *, day: datetime, basis: str) -> datetime | None:
    """Up to when ``day`` (today) is summed under ``basis``: the latest end of its rows held
    only in part; None where it has no such row."""
    g = cost_gpu_1d.c
    query = select(func.max(g.held_until)).where(g.day == day, g.basis == basis)
    value = conn.execute(query).scalar_one_or_none()
    return None if value is None else _utc(value)


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
    _insert(conn, gpu_rows, job_rows)
    sum_job_days(conn, sorted(by_day))


def replace_day(
    conn: Connection,
    *,
    day: datetime,
    gpu_rows: Sequence[dict[str, Any]],
    job_rows: Sequence[dict[str, Any]],
) -> None:
    """Replace every sum of ``day`` with these rows."""
    for table in (cost_gpu_1d, cost_job_1d):
        conn.execute(delete(table).where(table.c.day == day))
    _insert(conn, gpu_rows, job_rows)
    sum_job_days(conn, [day])


def sum_job_days(conn: Connection, days: Sequence[datetime]) -> None:
    """Replace the cost_job_day_1d rows of ``days`` with their cost_job_1d rows summed per
    job, in the database (a day of a 10,000-GPU fleet is about 20,000 rows)."""
    j = cost_job_1d.c
    if conn.dialect.name == "postgresql":
        ids = func.string_agg(cast(j.gpu_id, Text), literal(","))
    else:
        ids = func.group_concat(j.gpu_id, ",")
    cols = ["day", "job_id", "gpu_ids", *COST_SUM_FIELDS]
    for day in days:
        conn.execute(delete(cost_job_day_1d).where(cost_job_day_1d.c.day == day))
        summed = (
            select(j.day, j.job_id, ids, *(func.sum(j[f]) for f in COST_SUM_FIELDS))
            .where(j.day == day)
            .group_by(j.day, j.job_id)
        )
        conn.execute(insert(cost_job_day_1d).from_select(cols, summed))


def _insert(
    conn: Connection, gpu_rows: Sequence[dict[str, Any]], job_rows: Sequence[dict[str, Any]]
) -> None:
    """Insert the rows (each table's rows share their keys): a binary COPY on PostgreSQL,
    which builds no statement parameters per row (today's 3,000 rows of 1,000 GPUs took most
    of the today-sums write's CPU as an executemany)."""
    pg = conn.dialect.name == "postgresql"
    for table, rows in ((cost_gpu_1d, gpu_rows), (cost_job_1d, job_rows)):
        if pg and rows:
            cols = list(rows[0])
            load_rows(conn, table, cols, ([row[col] for col in cols] for row in rows))
            continue
        for i in range(0, len(rows), 2000):
            conn.execute(insert(table), list(rows[i : i + 2000]))


def delete_days_before(conn: Connection, *, cutoff: datetime) -> int:
    """Delete the sums of days before ``cutoff``; returns how many GPU-day rows."""
    n = conn.execute(delete(cost_gpu_1d).where(cost_gpu_1d.c.day < cutoff)).rowcount
    conn.execute(delete(cost_job_1d).where(cost_job_1d.c.day < cutoff))
    conn.execute(delete(cost_job_day_1d).where(cost_job_day_1d.c.day < cutoff))
    return int(n or 0)


def take_write_lock(conn: Connection) -> None:
    """On SQLite, take the write lock at the start of the transaction: one that read before
    another writer committed could not write after it. (On PostgreSQL the job runs on one
    replica at a time, and rows are replaced by key.)"""
    if conn.dialect.name == "sqlite":
        conn.execute(delete(cost_day_dirty).where(cost_day_dirty.c.id < 0))
