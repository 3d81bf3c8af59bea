"""Jobs nobody registered, from the agents' process observations: jobs rows and GPU intervals.

At ingest, each (GPU, job) pair seen in a batch's ``processes`` gets a ``jobs`` row if the id is
new (source 'observed'; an existing row, say one set via the API, is never touched) and an open
``job_gpus`` interval (source 'observed') from the first time it was seen. A scheduler job closes
observed intervals unseen for a grace period, at the last time they were seen (not on a GPU
reported lost: no process shows there, and the job that held it pays its lost time). An interval
closed while the agent could not report is reopened when its late observations arrive, unless
another job took the GPU in between.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, exists, func, insert, select, update

from service.core.work_key import key_of_row
from service.db import tenant_marks
from service.db.dialect import insert_ignore
from service.db.schema import gpu_processes, gpus, job_gpus, jobs, nodes

OBSERVED = "observed"


@dataclass(frozen=True, slots=True)
class Seen:
    """One (GPU uuid, job) pair in a batch, with its first and last time and a user name."""

    gpu_uuid: str
    job_id: str
    first: datetime
    last: datetime
    user: str | None


def summarise(
    observations: Iterable[tuple[str, str | None, datetime, str | None]],
) -> list[Seen]:
    """Group (gpu_uuid, job_id, ts, user) observations into one Seen per (GPU, job)."""
    out: dict[tuple[str, str], Seen] = {}
    for uuid, job, ts, user in observations:
        if job is None:
            continue
        ts = ts.astimezone(UTC)
        cur = out.get((uuid, job))
        if cur is None:
            out[(uuid, job)] = Seen(uuid, job, ts, ts, user)
        else:
            out[(uuid, job)] = Seen(
                uuid, job, min(cur.first, ts), max(cur.last, ts), cur.user or user
            )
    return list(out.values())


@dataclass(frozen=True, slots=True)
class Disputed:
    """A process hint of node ``node`` naming a job whose user is another (see ``observe``)."""

    job_id: str
    node: str
    user: str


def _disputed(
    conn: Connection, seen: list[Seen], node_of: dict[str, tuple[int, str]]
) -> list[tuple[Seen, Disputed]]:
    """The hints that name a stored job with another user, from a node that registered none of
    that job's intervals while another node did: another node's job (a squatted or reused id,
    or one on a GPU that moved here), never theirs to join. A job no GPU is known for yet (an
    admin's, say) takes any hint."""
    job_ids = {s.job_id for s in seen}
    users = dict(conn.execute(select(jobs.c.id, jobs.c.user).where(jobs.c.id.in_(job_ids))).all())
    # By the node each interval was registered from: a GPU moved here brings no part of a job.
    registered: dict[str, set[str | None]] = {}
    q = select(job_gpus.c.job_id, job_gpus.c.registered_node).where(job_gpus.c.job_id.in_(job_ids))
    for job_id, node in conn.execute(q):
        registered.setdefault(job_id, set()).add(node)
    out = []
    for s in seen:
        user, where = users.get(s.job_id), node_of.get(s.gpu_uuid)
        if (
            user
            and s.user
            and s.user != user
            and where is not None
            and registered.get(s.job_id)
            and where[1] not in registered[s.job_id]
        ):
            out.append((s, Disputed(s.job_id, where[1], s.user)))
    return out


def observe(
    conn: Connection, *, seen: list[Seen], now: datetime, disputed: list[Disputed] | None = None
) -> dict[str, int]:
    """Create missing observed jobs and open (or reopen) observed intervals for ``seen``.

    A hint that names another node's job with another user opens nothing: it is appended to
    ``disputed`` instead.
    """
    if not seen:
        return {"jobs": 0, "opened": 0, "reopened": 0}
    seen = _undisputed(conn, seen, disputed)
    if not seen:
        return {"jobs": 0, "opened": 0, "reopened": 0}
    ids: dict[str, int] = {}
    hosts: dict[int, str] = {}  # each GPU's node now: it registers what it opens
    for r in conn.execute(
        select(gpus.c.uuid, gpus.c.id, nodes.c.hostname)
        .join(nodes, nodes.c.id == gpus.c.node_id)
        .where(gpus.c.uuid.in_({s.gpu_uuid for s in seen}))
    ):
        ids[r.uuid], hosts[r.id] = r.id, r.hostname
    created = _create_jobs(conn, seen, now)
    by_gpu = _intervals_by_gpu(conn, {ids[s.gpu_uuid] for s in seen if s.gpu_uuid in ids})
    counts = {"opened": 0, "reopened": 0}
    touched_jobs: set[str] = set()
    for s in seen:
        gpu_id = ids.get(s.gpu_uuid)
        if gpu_id is None:
            continue
        how = _open_interval(conn, s, gpu_id, hosts[gpu_id], by_gpu.get(gpu_id, []))
        if how is not None:
            counts[how] += 1
            touched_jobs.add(s.job_id)
    if touched_jobs:
        conn.execute(
            update(jobs)
            .where(and_(jobs.c.id.in_(touched_jobs), jobs.c.source == OBSERVED))
            .values(ended_at=None, updated_at=now)
        )
    return {"jobs": created, "opened": counts["opened"], "reopened": counts["reopened"]}


def _undisputed(conn: Connection, seen: list[Seen], disputed: list[Disputed] | None) -> list[Seen]:
    """``seen`` less the hints ``_disputed`` refuses, which go to ``disputed``."""
    node_of = {
        r.uuid: (r.node_id, r.hostname)
        for r in conn.execute(
            select(gpus.c.uuid, gpus.c.node_id, nodes.c.hostname)
            .join(nodes, nodes.c.id == gpus.c.node_id)
            .where(gpus.c.uuid.in_({s.gpu_uuid for s in seen}))
        )
    }
    refused = _disputed(conn, seen, node_of)
    if not refused:
        return seen
    if disputed is not None:
        disputed.extend(d for _, d in refused)
    skip = {id(s) for s, _ in refused}
    return [s for s in seen if id(s) not in skip]


def _create_jobs(conn: Connection, seen: list[Seen], now: datetime) -> int:
    """Insert an observed jobs row for each job of ``seen`` not stored yet, from its first
    sighting; returns how many were new."""
    first_by_job: dict[str, Seen] = {}
    for s in seen:
        cur = first_by_job.get(s.job_id)
        if cur is None or s.first < cur.first:
            first_by_job[s.job_id] = s
    res = conn.execute(
        insert_ignore(conn, jobs, ["id"]),
        [
            {
                "id": job,
                "user": s.user,
                "team": None,
                "project": None,
                "labels": {},
                "work_key": key_of_row(job, s.user, None, {}),
                "source": OBSERVED,
                "started_at": s.first,
                "ended_at": None,
                "created_at": now,
                "updated_at": now,
            }
            for job, s in first_by_job.items()
        ],
    )
    return max(res.rowcount or 0, 0)


def _intervals_by_gpu(conn: Connection, gpu_ids: set[int]) -> dict[int, list[Any]]:
    """Every job_gpus interval (any job, any source) of the GPUs ``gpu_ids``, by GPU id."""
    rows = conn.execute(
        select(
            job_gpus.c.id,
            job_gpus.c.job_id,
            job_gpus.c.gpu_id,
            job_gpus.c.started_at,
            job_gpus.c.ended_at,
            job_gpus.c.source,
            job_gpus.c.registered_node,
        ).where(job_gpus.c.gpu_id.in_(gpu_ids))
    ).all()
    by_gpu: dict[int, list[Any]] = {}
    for r in rows:
        by_gpu.setdefault(r.gpu_id, []).append(r)
    return by_gpu


def _open_interval(
    conn: Connection, s: Seen, gpu_id: int, node: str, on_gpu: list[Any]
) -> str | None:
    """Reopen the latest observed interval of ``s``'s job on GPU ``gpu_id`` (``on_gpu``: its
    intervals) if no other job took the GPU since, else open one from ``s.first`` registered to
    ``node``; returns 'reopened', 'opened', or None where an interval already covers ``s``."""
    mine = [r for r in on_gpu if r.job_id == s.job_id]
    if any(r.ended_at is None or r.ended_at >= s.last for r in mine):
        return None  # already covered (an open interval, or one set via the API that spans it)
    # Only this node's own observed intervals reopen: one seen from a GPU's old node stays shut.
    observed = [r for r in mine if r.source == OBSERVED and r.registered_node == node]
    latest = max(observed, key=lambda r: r.ended_at, default=None)
    if latest is not None:
        others_since = [
            r for r in on_gpu if r.job_id != s.job_id and r.started_at >= latest.ended_at
        ]
        if not others_since:
            conn.execute(update(job_gpus).where(job_gpus.c.id == latest.id).values(ended_at=None))
            tenant_marks.mark_shared(
                conn, gpu_id=gpu_id, job_id=s.job_id, start=latest.ended_at, end=None
            )
            return "reopened"
    conn.execute(
        insert(job_gpus).values(
            job_id=s.job_id,
            gpu_id=gpu_id,
            started_at=s.first,
            ended_at=None,
            source=OBSERVED,
            registered_node=node,
        )
    )
    tenant_marks.mark_shared(conn, gpu_id=gpu_id, job_id=s.job_id, start=s.first, end=None)
    return "opened"


def close_unseen(conn: Connection, *, now: datetime, grace_seconds: float) -> int:
    """Close observed intervals not seen for ``grace_seconds``, at the time they were last seen;
    those on a GPU reported lost stay open (no process can be seen on it)."""
    cutoff = now - timedelta(seconds=grace_seconds)
    jg, p = job_gpus.c, gpu_processes.c
    # One statement for every open interval (the primary key finds each GPU's recent rows):
    # asked one by one, 10,000 GPUs' intervals took a round trip each, 10-30 s a round.
    seen = exists().where(p.gpu_id == jg.gpu_id, p.job_id == jg.job_id, p.ts >= cutoff)
    # A GPU fallen off the bus lists no process: its job still holds it, and its lost time is
    # that job's bill (design.md section 4), until the GPU returns or the job ends.
    lost = exists().where(gpus.c.id == jg.gpu_id, gpus.c.lost_at.is_not(None))
    unseen = conn.execute(
        select(jg.id, jg.job_id, jg.gpu_id, jg.started_at).where(
            jg.source == OBSERVED, jg.ended_at.is_(None), ~seen, ~lost
        )
    ).all()
    closed_jobs: set[str] = set()
    closed = 0
    for r in unseen:
        match = and_(gpu_processes.c.gpu_id == r.gpu_id, gpu_processes.c.job_id == r.job_id)
        last = conn.execute(
            select(func.max(gpu_processes.c.ts)).where(
                and_(match, gpu_processes.c.ts >= r.started_at)
            )
        ).scalar()
        conn.execute(
            update(job_gpus).where(job_gpus.c.id == r.id).values(ended_at=last or r.started_at)
        )
        tenant_marks.mark_after(conn, gpu_ids=[r.gpu_id], since=last or r.started_at)
        closed_jobs.add(r.job_id)
        closed += 1
    if closed_jobs:
        still_open = set(
            conn.execute(
                select(job_gpus.c.job_id).where(
                    and_(job_gpus.c.job_id.in_(closed_jobs), job_gpus.c.ended_at.is_(None))
                )
            ).scalars()
        )
        for job in closed_jobs - still_open:
            end = conn.execute(
                select(func.max(job_gpus.c.ended_at)).where(job_gpus.c.job_id == job)
            ).scalar()
            conn.execute(
                update(jobs)
                .where(and_(jobs.c.id == job, jobs.c.source == OBSERVED))
                .values(ended_at=end, updated_at=now)
            )
    return closed
