"""The cost day sums read for a report, grouped in the database: each job's bounding dollars,
the totals, and the sums per group, per GPU and per (team, GPU) over whole UTC days (the
rows are written by ``cost_days_repo``)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Text,
    cast,
    func,
    literal,
    select,
    tuple_,
    union_all,
)
from sqlalchemy.types import NullType

from service.db.costing.cost_days_repo import UNALLOCATED_JOB
from service.db.jobs_repo import scope_condition
from service.db.schema import (
    cost_gpu_1d,
    cost_job_1d,
    cost_job_day_1d,
    jobs,
)
from service.roles import JobScope


@contextmanager
def _report_read(conn: Connection) -> Iterator[None]:
    """On PostgreSQL, enough work_mem to group a month of rows in memory and no JIT (it
    would compile for longer than the query runs), for the statements inside."""
    pg = conn.dialect.name == "postgresql"
    if pg:
        # A month of a 10,000-GPU fleet's (job, GPU, day) rows (615,000, 48 sums each) is
        # hashed per job in about 100 MB; at 64 MB PostgreSQL sorted them on disk instead
        # (1.06 s against 0.81 s for the query). It is a ceiling, taken only as the hash grows.
        conn.exec_driver_sql("SET LOCAL work_mem = '256MB'; SET LOCAL jit = off")
    try:
        yield
    finally:
        if pg:
            conn.exec_driver_sql("SET LOCAL work_mem = DEFAULT; SET LOCAL jit = DEFAULT")


def _value_list(conn: Connection, column: Any, *, flat: bool = False) -> Any:
    """An aggregate of the values of ``column`` as a JSON array; on PostgreSQL a native array
    where ``flat`` (no list of lists to aggregate later): one per job of a report by job, and
    psycopg reads an array without decoding JSON."""
    if conn.dialect.name == "postgresql":
        # Untyped: psycopg already gives a list, and SQLAlchemy's ARRAY would copy each one.
        return func.array_agg(column, type_=NullType()) if flat else func.json_agg(column)
    return func.json_group_array(column)


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(json.loads(value) if isinstance(value, str) else value)


def _within(table: Any, start: datetime, end: datetime, excluded: Iterable[int]) -> list[Any]:
    c = table.c
    cond = [c.day >= start, c.day < end]
    left_out = sorted(excluded)
    if left_out:
        cond.append(c.gpu_id.not_in(left_out))
    return cond


def _owned_by(
    user: str | None,
    team: str | None,
    jobs_only: bool = False,
    job_id: Any = None,
    scope: JobScope | None = None,
) -> list[Any]:
    """Conditions on a ``job_id`` column (cost_job_1d's by default): only rows of jobs of
    ``user`` and ``team`` where given, and of jobs ``scope`` allows where given (so none of
    the time no job held), only rows of jobs with ``jobs_only``."""
    column = cost_job_1d.c.job_id if job_id is None else job_id
    cond = []
    if user is not None:
        cond.append(jobs.c.user == user)
    if team is not None:
        cond.append(jobs.c.team == team)
    if scope is not None:
        cond.append(scope_condition(scope))
    if cond:
        return [column.in_(select(jobs.c.id).where(*cond))]
    return [column != UNALLOCATED_JOB] if jobs_only else []


def _joined_text(conn: Connection, column: Any) -> Any:
    """An aggregate of the comma-joined texts of ``column`` joined by commas."""
    if conn.dialect.name == "postgresql":
        return func.string_agg(column, literal(","))
    return func.group_concat(column, ",")


def gpu_set(text: str | None) -> set[int]:
    """The GPU ids of a comma-joined text of them (repeats allowed)."""
    return {int(x) for x in set(text.split(","))} if text else set()


def _job_days(
    conn: Connection,
    *,
    start: datetime,
    end: datetime,
    excluded: Iterable[int],
    fields: Sequence[str],
    owned: tuple[str | None, str | None, bool],
    job_ids: Sequence[str] | None = None,
    scope: JobScope | None = None,
) -> Any:
    """The rows of each job and day in [start, end), GPUs ``excluded`` left out, only the
    jobs ``owned`` (user, team, jobs_only as ``_owned_by``), of ``scope`` and ``job_ids`` if
    given: (job
    id, its GPUs' ids comma-joined, ``fields``). From cost_job_day_1d, but for the (job, day)s
    that held an excluded GPU: their other GPUs' cost_job_1d rows."""
    t, j = cost_job_day_1d.c, cost_job_1d.c
    user, team, jobs_only = owned
    only_t = [] if job_ids is None else [t.job_id.in_(sorted(set(job_ids)))]
    per_day = select(t.job_id, t.gpu_ids, *(t[f] for f in fields)).where(
        *_within(cost_job_day_1d, start, end, ()),
        *_owned_by(user, team, jobs_only, t.job_id, scope), *only_t,
    )  # fmt: skip
    left_out = sorted(excluded)
    if not left_out:
        return per_day.subquery()
    only_j = [] if job_ids is None else [j.job_id.in_(sorted(set(job_ids)))]
    mixed = select(j.day, j.job_id).where(j.day >= start, j.day < end, j.gpu_id.in_(left_out))
    gpu_text = cast(j.gpu_id, Text).label("gpu_ids")
    per_gpu = select(j.job_id, gpu_text, *(j[f] for f in fields)).where(
        *_within(cost_job_1d, start, end, left_out), *_owned_by(user, team, jobs_only, None, scope),
        tuple_(j.day, j.job_id).in_(mixed), *only_j,
    )  # fmt: skip
    return union_all(per_day.where(tuple_(t.day, t.job_id).not_in(mixed)), per_gpu).subquery()


def job_dollars(
    conn: Connection,
    *,
    start: datetime,
    end: datetime,
    excluded: Iterable[int],
    idle_fields: Sequence[str],
    fixable_fields: Sequence[str],
    user: str | None = None,
    team: str | None = None,
    jobs_only: bool = False,
    scope: JobScope | None = None,
) -> list[tuple[str, float, float, float, float]]:
    """Per job over the days in [start, end), GPUs ``excluded`` left out, only jobs of ``user``
    and ``team`` if given (of any job with ``jobs_only``): (job id, the sums of
    ``idle_fields`` and of ``fixable_fields``, cost USD, unpriced seconds); a few sums a row,
    so the statement runs in parallel and reads back light."""
    read = [*dict.fromkeys((*idle_fields, *fixable_fields, "cost_usd", "unpriced_seconds"))]
    j = _job_days(
        conn, start=start, end=end, excluded=excluded, fields=read,
        owned=(user, team, jobs_only), scope=scope,
    ).c  # fmt: skip

    def total(names: Sequence[str]) -> Any:
        return func.sum(sum((j[f] for f in names[1:]), j[names[0]]))

    sums = (total(idle_fields), total(fixable_fields), func.sum(j.cost_usd),
            func.sum(j.unpriced_seconds))  # fmt: skip
    query = select(j.job_id, *sums).group_by(j.job_id)
    with _report_read(conn):
        return [
            (str(k), float(i or 0.0), float(f or 0.0), float(c or 0.0), float(u or 0.0))
            for k, i, f, c, u in conn.execute(query).all()
        ]


def total_sums(
    conn: Connection,
    *,
    start: datetime,
    end: datetime,
    excluded: Iterable[int],
    fields: Sequence[str],
    user: str | None = None,
    team: str | None = None,
    jobs_only: bool = False,
    scope: JobScope | None = None,
) -> tuple[list[int], tuple[Any, ...]]:
    """The (job, GPU, day) rows of the days in [start, end) summed (their sums per job and
    day), GPUs ``excluded`` left out, only jobs of ``user`` and ``team`` if given (of any job
    with ``jobs_only``) and of ``scope``: (the GPUs they cover, the sums of ``fields``)."""
    j = _job_days(
        conn, start=start, end=end, excluded=excluded, fields=fields,
        owned=(user, team, jobs_only), scope=scope,
    ).c  # fmt: skip
    with _report_read(conn):
        row = conn.execute(
            select(_joined_text(conn, j.gpu_ids), *(func.sum(j[f]) for f in fields))
        ).one()
    return sorted(gpu_set(row[0])), tuple(row[1:])


def group_sums(
    conn: Connection,
    *,
    start: datetime,
    end: datetime,
    excluded: Iterable[int],
    fields: Sequence[str],
    group_by: str,
    user: str | None = None,
    team: str | None = None,
    jobs_only: bool = False,
    scope: JobScope | None = None,
    job_ids: Sequence[str] | None = None,
) -> list[tuple[bool, str | None, dict[str, Any], list[int], list[str], tuple[Any, ...]]]:
    """The (job, GPU, day) rows of the days in [start, end) (their sums per job and day)
    summed per ``group_by`` (job, user, team or project, as the jobs are now), GPUs
    ``excluded`` left out, only jobs of ``user`` and ``team`` if given (of any job with
    ``jobs_only``), and only the jobs ``job_ids`` if given (UNALLOCATED_JOB for time no job
    held): (time no job held, key, the owner fields of a job's group, its GPU ids, its job
    ids, the sums of ``fields``)."""
    j = _job_days(
        conn, start=start, end=end, excluded=excluded, fields=fields,
        owned=(user, team, jobs_only), scope=scope,
        job_ids=None if job_ids is None else list(job_ids),
    ).c  # fmt: skip
    # Summed per job first (hashed on one key, no join), then joined to the jobs' owners and,
    # unless grouping by job, summed again per group over those few rows.
    per_job = (
        select(
            j.job_id,
            _joined_text(conn, j.gpu_ids).label("gpu_list"),
            *(func.sum(j[f]).label(f) for f in fields),
        )
        .group_by(j.job_id)
        .subquery()
    )
    x = per_job.c
    no_job = (x.job_id == UNALLOCATED_JOB).label("no_job")
    joined = per_job.outerjoin(jobs, jobs.c.id == x.job_id)
    query: Any
    if group_by == "job":
        query = select(no_job, x.job_id, jobs.c.user, jobs.c.team, jobs.c.project,
                       x.gpu_list,
                       x.job_id, *(x[f] for f in fields))  # fmt: skip
        query = query.select_from(joined)
    else:
        key = jobs.c[group_by]
        query = (
            select(
                no_job,
                key,
                *(func.min(jobs.c[f]) for f in ("user", "team", "project")),
                _joined_text(conn, x.gpu_list),
                _value_list(conn, x.job_id),
                *(func.sum(x[f]) for f in fields),
            )
            .select_from(joined)
            .group_by(no_job, key)
        )
    out = []
    with _report_read(conn):
        for unallocated, k, u, t, p, gpu_list, job_list, *values in conn.execute(query).all():
            gpu_ids = sorted(gpu_set(gpu_list))
            if group_by == "job":
                job_ids = [] if unallocated else [str(job_list)]
            else:
                job_ids = sorted({str(v) for v in _as_list(job_list)} - {UNALLOCATED_JOB})
            owner_of = {"user": u, "team": t, "project": p}
            out.append((bool(unallocated), k, owner_of, gpu_ids, job_ids, tuple(values)))
    return out


def gpu_sums(
    conn: Connection,
    *,
    start: datetime,
    end: datetime,
    excluded: Iterable[int],
    fields: Sequence[str],
) -> list[tuple[int, list[str], tuple[Any, ...]]]:
    """Per GPU over the days in [start, end), GPUs ``excluded`` left out: (GPU id, the jobs
    that held it, the sums of ``fields``)."""
    g, j = cost_gpu_1d.c, cost_job_1d.c
    sums = (
        select(g.gpu_id, *(func.sum(g[f]) for f in fields))
        .where(*_within(cost_gpu_1d, start, end, excluded))
        .group_by(g.gpu_id)
    )
    held_by = (
        select(j.gpu_id, _value_list(conn, j.job_id))
        .where(*_within(cost_job_1d, start, end, excluded), j.job_id != UNALLOCATED_JOB)
        .group_by(j.gpu_id)
    )
    with _report_read(conn):
        job_lists = {int(gpu): sorted(set(_as_list(ids))) for gpu, ids in conn.execute(held_by)}
        return [
            (int(gpu), [str(x) for x in job_lists.get(int(gpu), [])], tuple(values))
            for gpu, *values in conn.execute(sums)
        ]


def team_gpu_sums(
    conn: Connection,
    *,
    start: datetime,
    end: datetime,
    excluded: Iterable[int],
    fields: Sequence[str],
) -> list[tuple[str, int, tuple[Any, ...]]]:
    """Per (team, GPU) over the days in [start, end), GPUs ``excluded`` left out, of the
    jobs with a team as they are now: (team, GPU id, the sums of ``fields``)."""
    j = cost_job_1d.c
    query = (
        select(jobs.c.team, j.gpu_id, *(func.sum(j[f]) for f in fields))
        .join(jobs, jobs.c.id == j.job_id)
        .where(*_within(cost_job_1d, start, end, excluded), jobs.c.team.is_not(None))
        .group_by(jobs.c.team, j.gpu_id)
    )
    with _report_read(conn):
        return [(str(team), int(gpu), tuple(values)) for team, gpu, *values in conn.execute(query)]


# --- writes ---------------------------------------------------------------------------------
