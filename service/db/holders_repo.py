"""Which jobs hold each GPU at a given time: the one rule every "who holds this GPU" reader uses.

A job holds a GPU from its interval's ``started_at`` until its ``ended_at`` (exclusive) and
until the job's own ``ended_at``. A start is stamped by the node's clock, which may run ahead
of central's: a start up to ``start_skew_seconds`` after ``now`` (the same allowance ingest
gives a node's timestamps) is a node ahead of us and holds already; a start further ahead is
a job that has not started and holds nothing yet. Ends are taken as recorded: a job whose end
is still ahead of ``now`` holds until then.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

from sqlalchemy import Connection, or_, select

from service.db.schema import gpus, job_gpus, jobs


class Holder(NamedTuple):
    """A job holding a GPU: its id, user, team, project and when its interval started."""

    job_id: str
    user: str | None
    team: str | None
    project: str | None
    started_at: datetime


def holders_at(
    conn: Connection,
    *,
    now: datetime,
    start_skew_seconds: float,
    node_ids: Collection[int] | None = None,
) -> Mapping[int, Sequence[Holder]]:
    """The jobs holding each GPU (by GPU id) at ``now``, earliest started first, so the last
    one is the GPU's current job; only GPUs of ``node_ids`` when given; GPUs held by none are
    absent. One statement for the whole fleet."""
    started_by = now + timedelta(seconds=start_skew_seconds)
    query = (
        select(
            job_gpus.c.gpu_id,
            jobs.c.id,
            jobs.c.user,
            jobs.c.team,
            jobs.c.project,
            job_gpus.c.started_at,
        )
        .join(jobs, jobs.c.id == job_gpus.c.job_id)
        .where(
            job_gpus.c.started_at <= started_by,
            or_(job_gpus.c.ended_at.is_(None), job_gpus.c.ended_at > now),
            or_(jobs.c.ended_at.is_(None), jobs.c.ended_at > now),
        )
        .order_by(job_gpus.c.started_at, job_gpus.c.id)
    )
    if node_ids is not None:
        query = query.join(gpus, gpus.c.id == job_gpus.c.gpu_id).where(gpus.c.node_id.in_(node_ids))
    held: dict[int, list[Holder]] = {}
    # fetchall and a positional Holder: a fleet's ten thousand rows one by one cost twice this.
    for gpu_id, job_id, user, team, project, started_at in conn.execute(query).all():
        holder = Holder(job_id, user, team, project, started_at)
        if gpu_id in held:
            held[gpu_id].append(holder)
        else:
            held[gpu_id] = [holder]
    return held


def held_spans(
    conn: Connection, *, gpu_ids: Collection[int], start: datetime, end: datetime
) -> Mapping[int, Sequence[tuple[datetime, datetime | None]]]:
    """When a job held each of ``gpu_ids`` between ``start`` and ``end`` (inclusive), as
    [from, until) spans (until None: still held), by the rule of ``holders_at``; GPUs held by
    none are absent."""
    query = (
        select(job_gpus.c.gpu_id, job_gpus.c.started_at, job_gpus.c.ended_at, jobs.c.ended_at)
        .join(jobs, jobs.c.id == job_gpus.c.job_id)
        .where(
            job_gpus.c.gpu_id.in_(list(gpu_ids)),
            job_gpus.c.started_at <= end,
            or_(job_gpus.c.ended_at.is_(None), job_gpus.c.ended_at > start),
            or_(jobs.c.ended_at.is_(None), jobs.c.ended_at > start),
        )
    )
    spans: dict[int, list[tuple[datetime, datetime | None]]] = {}
    for gpu_id, started, ended, job_ended in conn.execute(query).all():
        until = min((e for e in (ended, job_ended) if e is not None), default=None)
        spans.setdefault(gpu_id, []).append((started, until))
    return spans
