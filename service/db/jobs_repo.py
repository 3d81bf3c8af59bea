"""Jobs and their GPU intervals: create-or-merge by id, end, get and list."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    String,
    and_,
    any_,
    bindparam,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql

from service.core.work_key import key_of_row
from service.db import tenant_marks
from service.db.dialect import insert_ignore
from service.db.rows import JobConflict, JobInterval, JobRow
from service.db.schema import gpus, job_conflicts, job_gpus, jobs, nodes
from service.errors import Forbidden, NotFound, ValidationFailed
from service.roles import JobScope


def scope_condition(scope: JobScope) -> ColumnElement[bool]:
    """The jobs ``scope`` allows, as a condition on the jobs table: the person's own jobs and
    their teams' (the SQL twin of ``JobScope.allows``)."""
    return or_(jobs.c.user.in_(sorted(scope.users)), jobs.c.team.in_(sorted(scope.teams)))


def gpus_held_in_scope(conn: Connection, *, scope: JobScope, uuids: Collection[str]) -> set[str]:
    """Those of ``uuids`` that a job ``scope`` allows ever held."""
    query = (
        select(gpus.c.uuid)
        .distinct()
        .join(job_gpus, job_gpus.c.gpu_id == gpus.c.id)
        .join(jobs, jobs.c.id == job_gpus.c.job_id)
        .where(gpus.c.uuid.in_(sorted(set(uuids))), scope_condition(scope))
    )
    return {str(u) for (u,) in conn.execute(query)}


def gpu_ids_by_uuid(conn: Connection, *, uuids: Sequence[str]) -> dict[str, tuple[int, str]]:
    """(gpu id, node hostname) of each known uuid among ``uuids``."""
    return {u: (gid, host) for u, (gid, host, _) in known_gpus(conn, uuids=uuids).items()}


def known_gpus(conn: Connection, *, uuids: Sequence[str]) -> dict[str, tuple[int, str, datetime]]:
    """(gpu id, node hostname, first seen) of each known uuid among ``uuids``."""
    rows = conn.execute(
        select(gpus.c.uuid, gpus.c.id, nodes.c.hostname, gpus.c.first_seen_at)
        .join(nodes, nodes.c.id == gpus.c.node_id)
        .where(gpus.c.uuid.in_(list(uuids)))
    )
    return {r.uuid: (r.id, r.hostname, r.first_seen_at) for r in rows}


def upsert_job(
    conn: Connection,
    *,
    job_id: str,
    fields: dict[str, Any],
    gpu_uuids: Sequence[str],
    started_at: datetime,
    ended_at: datetime | None,
    now: datetime,
    only_node: str | None = None,
) -> bool:
    """Create job ``job_id`` or merge into it (an observed one keeps its intervals); True if new.

    ``fields`` (user, team, project, labels) overwrite stored values; each GPU in ``gpu_uuids``
    gets an 'api' interval unless the job already holds it open. ``only_node`` restricts an
    agent token to its own node's GPUs; its ``ended_at`` then ends only the intervals it adds,
    never an existing job (other nodes may still hold it).
    """
    known = gpu_ids_by_uuid(conn, uuids=gpu_uuids)
    _check_gpus(known, gpu_uuids, only_node)
    existing = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
    created = False
    if existing is None:
        created = _insert_job(conn, job_id, fields, started_at, ended_at, now)
        if not created:
            # Another request made it meanwhile (each node's prolog of a multi-node job runs at
            # once): merge into that one. Its metadata was set at creation; an agent keeps it.
            existing = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
            if only_node is not None:
                fields = {}
    if existing is not None:
        # An agent's end ends only the intervals it adds: other nodes may still hold the job.
        end = ended_at if only_node is None else None
        _merge_job(conn, existing, fields, started_at, end, now)
    gpu_ids = {known[u][0]: known[u][1] for u in dict.fromkeys(gpu_uuids)}
    _add_api_intervals(conn, job_id, gpu_ids, started_at, ended_at)
    return created


def _check_gpus(
    known: Mapping[str, tuple[int, str]], gpu_uuids: Sequence[str], only_node: str | None
) -> None:
    """Raise unless every uuid of ``gpu_uuids`` is ``known`` and, for an agent, on its node."""
    for i, uuid in enumerate(gpu_uuids):
        if uuid not in known:
            raise ValidationFailed(f"gpus.{i}", f"no GPU with uuid {uuid!r} is known")
        if only_node is not None and known[uuid][1] != only_node:
            raise Forbidden(f"gpus.{i}: GPU {uuid} is not on this agent's node {only_node!r}")


def _insert_job(
    conn: Connection,
    job_id: str,
    fields: Mapping[str, Any],
    started_at: datetime,
    ended_at: datetime | None,
    now: datetime,
) -> bool:
    """Insert job ``job_id`` (source 'api') unless a row of that id exists; True if inserted."""
    return (
        conn.execute(
            insert_ignore(conn, jobs, ["id"])
            .values(
                id=job_id,
                user=fields.get("user"),
                team=fields.get("team"),
                project=fields.get("project"),
                labels=fields.get("labels") or {},
                work_key=key_of_row(
                    job_id, fields.get("user"), fields.get("team"), fields.get("labels") or {}
                ),
                source="api",
                started_at=started_at,
                ended_at=ended_at,
                created_at=now,
                updated_at=now,
            )
            .returning(jobs.c.id)
        ).first()
        is not None
    )


def _merge_job(
    conn: Connection,
    existing: Any,
    fields: Mapping[str, Any],
    started_at: datetime,
    ended_at: datetime | None,
    now: datetime,
) -> None:
    """Update stored job ``existing`` with the set ``fields`` (labels merged), the earlier start
    and ``ended_at`` when given."""
    changes: dict[str, Any] = {k: v for k, v in fields.items() if v is not None}
    if "labels" in changes:
        changes["labels"] = {**(existing.labels or {}), **changes["labels"]}
    changes["started_at"] = min(existing.started_at, started_at)
    changes["work_key"] = _key_after(existing, changes)
    if ended_at is not None:
        changes["ended_at"] = ended_at
    changes["updated_at"] = now
    conn.execute(update(jobs).where(jobs.c.id == existing.id).values(**changes))


def _add_api_intervals(
    conn: Connection,
    job_id: str,
    gpu_ids: Mapping[int, str],
    started_at: datetime,
    ended_at: datetime | None,
) -> None:
    """Give job ``job_id`` an 'api' interval from ``started_at`` on each of ``gpu_ids`` (GPU id
    to its node now, which registers it) it does not already hold then, and tenant rows for the
    minutes it shares with other jobs."""
    open_gpus = set(
        conn.execute(
            select(job_gpus.c.gpu_id).where(
                job_gpus.c.job_id == job_id,
                job_gpus.c.source == "api",
                or_(job_gpus.c.ended_at.is_(None), job_gpus.c.ended_at > started_at),
                job_gpus.c.started_at <= started_at,
            )
        ).scalars()
    )
    added = [g for g in gpu_ids if g not in open_gpus]
    if not added:
        return
    conn.execute(
        insert(job_gpus),
        [
            {
                "job_id": job_id,
                "gpu_id": gpu_id,
                "started_at": started_at,
                "ended_at": ended_at,
                "source": "api",
                "registered_node": gpu_ids[gpu_id],
            }
            for gpu_id in added
        ],
    )
    for gpu_id in added:  # minutes shared with other jobs get tenant rows
        tenant_marks.mark_shared(conn, gpu_id=gpu_id, job_id=job_id, start=started_at, end=ended_at)


def end_earlier_jobs(
    conn: Connection,
    *,
    job_id: str,
    gpu_uuids: Sequence[str],
    started_at: datetime,
    now: datetime,
    only_node: str | None = None,
) -> list[str]:
    """End the other jobs of ``job_id``'s scheduler (the ``slurm:`` of ``slurm:8002``) still
    open on ``gpu_uuids`` since ``started_at`` or before, at ``started_at``; returns their ids.

    A job that holds its GPUs alone starts on them only once the scheduler freed them, so an
    earlier job still open there missed its end (a lost epilog, a node crash) and would
    otherwise share every later job's time and bill. For an agent (``only_node``), only the
    intervals its node registered: a GPU that moved to it brings no right to end another's.
    """
    scheduler, sep, _ = job_id.partition(":")
    if not sep or not gpu_uuids:
        return []
    gpu_ids = list(gpu_ids_by_uuid(conn, uuids=gpu_uuids).values())
    ids = [gid for gid, _node in gpu_ids]
    cond = and_(
        job_gpus.c.gpu_id.in_(ids),
        job_gpus.c.ended_at.is_(None),
        job_gpus.c.job_id != job_id,
        job_gpus.c.job_id.startswith(f"{scheduler}:", autoescape=True),
        # Not after: the scheduler never gives one GPU to two jobs at once, and prologs stamp
        # whole seconds, so a job started in the same second is as stale as an older one.
        job_gpus.c.started_at <= started_at,
    )
    if only_node is not None:
        cond = and_(cond, job_gpus.c.registered_node == only_node)
    ghosts = sorted(set(conn.execute(select(job_gpus.c.job_id).where(cond)).scalars()))
    if not ghosts:
        return []
    closing = list(set(conn.execute(select(job_gpus.c.gpu_id).where(cond)).scalars()))
    conn.execute(update(job_gpus).where(cond).values(ended_at=started_at))
    tenant_marks.mark_after(conn, gpu_ids=closing, since=started_at)
    for ghost in ghosts:
        still_open = conn.execute(
            select(job_gpus.c.id).where(job_gpus.c.job_id == ghost, job_gpus.c.ended_at.is_(None))
        ).first()
        if still_open is None:
            conn.execute(
                update(jobs)
                .where(jobs.c.id == ghost, jobs.c.ended_at.is_(None))
                .values(ended_at=started_at, updated_at=now)
            )
    return ghosts


def end_job(
    conn: Connection,
    *,
    job_id: str,
    ended_at: datetime,
    now: datetime,
    only_node: str | None = None,
) -> None:
    """Close the job's open intervals at ``ended_at`` (for an agent, only those ``only_node``
    registered).

    The job itself ends once none of its intervals is open.
    """
    row = conn.execute(select(jobs.c.started_at).where(jobs.c.id == job_id)).first()
    if row is None:
        raise NotFound(f"job {job_id!r} does not exist")
    if ended_at < row.started_at:
        raise ValidationFailed("ended_at", "must not be before the job's started_at")
    cond = and_(job_gpus.c.job_id == job_id, job_gpus.c.ended_at.is_(None))
    if only_node is not None:
        # The intervals the node registered, wherever their GPUs are now: a GPU that moved to
        # this node brings no right to end another node's part of the job.
        cond = and_(cond, job_gpus.c.registered_node == only_node)
    closing = list(conn.execute(select(job_gpus.c.gpu_id).where(cond)).scalars())
    closed = conn.execute(update(job_gpus).where(cond).values(ended_at=ended_at)).rowcount
    tenant_marks.mark_after(conn, gpu_ids=closing, since=ended_at)
    if only_node is not None and not closed:
        return  # this node's part had ended already; the job's own end is not its to move
    still_open = conn.execute(
        select(job_gpus.c.id).where(job_gpus.c.job_id == job_id, job_gpus.c.ended_at.is_(None))
    ).first()
    if still_open is None:
        conn.execute(
            update(jobs).where(jobs.c.id == job_id).values(ended_at=ended_at, updated_at=now)
        )


def update_fields(conn: Connection, *, job_id: str, fields: dict[str, Any], now: datetime) -> None:
    """Overwrite the given metadata fields of a job (labels merge key by key)."""
    existing = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
    if existing is None:
        raise NotFound(f"job {job_id!r} does not exist")
    changes = dict(fields)
    if "labels" in changes:
        changes["labels"] = {**(existing.labels or {}), **(changes["labels"] or {})}
    if changes:
        changes["work_key"] = _key_after(existing, changes)
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(**changes, updated_at=now))


def _key_after(existing: Any, changes: Mapping[str, Any]) -> str:
    """The work key of stored job ``existing`` once ``changes`` are written."""
    return key_of_row(
        existing.id,
        changes.get("user", existing.user),
        changes.get("team", existing.team),
        changes.get("labels", existing.labels) or {},
    )


def record_conflict(
    conn: Connection,
    *,
    job_id: str,
    node: str,
    source: str,
    claimed: dict[str, Any],
    at: datetime,
) -> None:
    """Keep node ``node``'s refused claim on job ``job_id`` (``source``: api or observed)."""
    conn.execute(
        insert(job_conflicts).values(
            job_id=job_id, node=node, source=source, claimed=claimed, at=at
        )
    )


def conflicts_of(conn: Connection, *, job_id: str) -> list[JobConflict]:
    """The refused claims on job ``job_id``, oldest first."""
    c = job_conflicts.c
    q = select(c.node, c.source, c.claimed, c.at).where(c.job_id == job_id).order_by(c.at, c.id)
    return [cast(JobConflict, dict(r._mapping)) for r in conn.execute(q)]


def conflict_line(
    existing: Mapping[str, Any], *, node: str, claimed: Mapping[str, Any], source: str
) -> str:
    """The audit line of node ``node``'s refused claim on job ``existing``: who claims what,
    whose claim stands, and how an admin settles it."""
    owners = sorted({iv["node"] for iv in existing.get("intervals", []) if iv["source"] == "api"})
    stands = ", ".join(f"{k}={existing.get(k)!r}" for k in claimed) or "its metadata"
    wants = ", ".join(f"{k}={v!r}" for k, v in claimed.items())
    by = f"nodes {', '.join(owners)}" if owners else "an admin or a process hint"
    how = "its agent token" if source == "api" else "its process hints"
    return (
        f"job ownership conflict: node {node} claims {wants} for job {existing['id']!r} through "
        f"{how}, which {by} registered with {stands}; refused and recorded on the job: an "
        f"admin settles it with PATCH /api/v1/jobs/{existing['id']}"
    )


def get_job(conn: Connection, *, job_id: str, for_update: bool = False) -> JobRow | None:
    """The job row with its intervals, or None: each with gpu uuid, node (the GPU's node now,
    for display), registered_node (the node that registered or observed it, whose agent has
    rights over it), started_at, ended_at and source. ``for_update`` locks the job's row until
    the transaction ends (PostgreSQL), so writes about one job take turns."""
    query = select(jobs).where(jobs.c.id == job_id)
    row = conn.execute(query.with_for_update() if for_update else query).first()
    if row is None:
        return None
    out = dict(row._mapping)
    out["intervals"] = [
        cast(JobInterval, dict(r._mapping))
        for r in conn.execute(
            select(
                job_gpus.c.gpu_id,
                gpus.c.uuid.label("gpu_uuid"),
                nodes.c.hostname.label("node"),
                job_gpus.c.registered_node,
                job_gpus.c.started_at,
                job_gpus.c.ended_at,
                job_gpus.c.source,
            )
            .join(gpus, gpus.c.id == job_gpus.c.gpu_id)
            .join(nodes, nodes.c.id == gpus.c.node_id)
            .where(job_gpus.c.job_id == job_id)
            .order_by(job_gpus.c.started_at, gpus.c.uuid)
        )
    ]
    out["conflicts"] = conflicts_of(conn, job_id=job_id)
    return cast(JobRow, out)


def jobs_by_id(conn: Connection, *, job_ids: Collection[str]) -> dict[str, dict[str, Any]]:
    """The stored rows of the jobs ``job_ids`` (those that exist), by id."""
    if not job_ids:
        return {}
    query = select(jobs).where(jobs.c.id.in_(sorted(set(job_ids))))
    return {r.id: dict(r._mapping) for r in conn.execute(query)}


LABELS_BATCH = 5000  # ids bound per statement on SQLite (it binds at most 32,766)


def job_labels(
    conn: Connection, *, job_ids: Collection[str], keys: Sequence[str]
) -> dict[str, dict[str, str]]:
    """The labels ``keys`` of the jobs ``job_ids`` (those that exist and have them), by id.

    PostgreSQL reads only those keys, as text, with one array parameter; SQLite reads the label
    documents (its JSON paths miss keys with quotes, backslashes or non-ASCII characters)."""
    ids = sorted(set(job_ids))
    out: dict[str, dict[str, str]] = {}
    if conn.dialect.name == "postgresql":
        ids_param = bindparam(None, ids, type_=postgresql.ARRAY(String))
        columns = [jobs.c.labels[k].as_string() for k in keys]
        query = select(jobs.c.id, *columns).where(jobs.c.id == any_(ids_param))
        for job_id, *values in conn.execute(query).all():
            out[job_id] = {k: v for k, v in zip(keys, values, strict=True) if v is not None}
        return out
    for i in range(0, len(ids), LABELS_BATCH):
        query = select(jobs.c.id, jobs.c.labels).where(jobs.c.id.in_(ids[i : i + LABELS_BATCH]))
        for job_id, labels in conn.execute(query).all():
            found = labels or {}
            out[job_id] = {k: str(found[k]) for k in keys if found.get(k) is not None}
    return out


def team_names(conn: Connection) -> list[str]:
    """Every team a stored job names, sorted (read from the team index)."""
    query = select(jobs.c.team).where(jobs.c.team.is_not(None)).distinct().order_by(jobs.c.team)
    return [team for (team,) in conn.execute(query).all()]
