"""Storage of the ladder's audit log: every step taken or declined, with the numbers behind it."""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime
from typing import cast

from sqlalchemy import Connection, and_, func, insert, or_, select

from service.db.rows import ActionRow, NewAction
from service.db.schema import ladder_actions
from service.vocabulary import ACTION_OUTCOMES

MAX_ACTIONS_LISTED = 1000


def record_action(conn: Connection, action: NewAction) -> int:
    """Append ``action`` to the audit log (a warning with the ``delivery_ids`` of its notice);
    returns its id."""
    if action.outcome not in ACTION_OUTCOMES:
        raise ValueError(f"unknown action outcome {action.outcome!r}")
    row = {f.name: getattr(action, f.name) for f in fields(action)}
    row["dry_run"] = int(action.dry_run)
    return int(
        conn.execute(
            insert(ladder_actions).values(**row).returning(ladder_actions.c.id)
        ).scalar_one()
    )


def list_actions(
    conn: Connection,
    *,
    job_id: str | None = None,
    user: str | None = None,
    team: str | None = None,
    policy: str | None = None,
    outcome: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    before_id: int | None = None,
    limit: int = 100,
) -> list[ActionRow]:
    """Audit-log rows matching every filter given, newest first (``since`` inclusive, ``until``
    exclusive), at most ``limit`` (capped at MAX_ACTIONS_LISTED); ``dry_run`` as a bool.

    ``before_id`` pages on: only rows after row ``before_id`` in that order (none if no such row).
    """
    t = ladder_actions
    q = select(t)
    filters = ((t.c.job_id, job_id), (t.c.user, user), (t.c.team, team), (t.c.policy, policy))
    for col, val in filters:
        if val is not None:
            q = q.where(col == val)
    if before_id is not None:
        at = select(t.c.at).where(t.c.id == before_id).scalar_subquery()
        q = q.where(or_(t.c.at < at, and_(t.c.at == at, t.c.id < before_id)))
    if outcome is not None:
        q = q.where(t.c.outcome == outcome)
    if since is not None:
        q = q.where(t.c.at >= since)
    if until is not None:
        q = q.where(t.c.at < until)
    q = q.order_by(t.c.at.desc(), t.c.id.desc()).limit(max(1, min(limit, MAX_ACTIONS_LISTED)))
    out = []
    for r in conn.execute(q):
        row = dict(r._mapping)
        row["dry_run"] = bool(row["dry_run"])
        out.append(cast(ActionRow, row))
    return out


def last_failure_at(
    conn: Connection, *, policy: str, job_id: str, alert_id: int, step: int
) -> datetime | None:
    """When ``step`` of this job's ladder in this episode last failed, or None."""
    t = ladder_actions
    value: datetime | None = conn.execute(
        select(func.max(t.c.at)).where(
            t.c.policy == policy,
            t.c.job_id == job_id,
            t.c.alert_id == alert_id,
            t.c.step == step,
            t.c.outcome == "failed",
        )
    ).scalar()
    return value


def latest_action(conn: Connection, *, policy: str, job_id: str, alert_id: int) -> ActionRow | None:
    """The newest audit row of this job's ladder in this episode, or None."""
    t = ladder_actions
    row = conn.execute(
        select(t)
        .where(t.c.policy == policy, t.c.job_id == job_id, t.c.alert_id == alert_id)
        .order_by(t.c.at.desc(), t.c.id.desc())
        .limit(1)
    ).first()
    # dry_run as stored (0 or 1): only the outcome, step and reason are compared.
    return cast(ActionRow, dict(row._mapping)) if row is not None else None


def warning_deliveries(
    conn: Connection, *, policy: str, job_id: str, alert_id: int, since: datetime
) -> list[str]:
    """The delivery ids of the live (not dry-run) warnings of this job's ladder in this
    episode recorded at or after ``since``."""
    t = ladder_actions
    rows = conn.execute(
        select(t.c.delivery_ids).where(
            t.c.policy == policy,
            t.c.job_id == job_id,
            t.c.alert_id == alert_id,
            t.c.outcome == "warned",
            t.c.dry_run == 0,
            t.c.at >= since,
        )
    )
    return [str(d) for (ids,) in rows for d in (ids or [])]
