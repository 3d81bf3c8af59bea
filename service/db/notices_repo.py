"""The record of every message queued for a person: what, to whom, when, and whether it went."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, delete, insert, select, update

from service.db.rows import NoticeRow
from service.db.schema import notices

NOTICE_FIELDS = (
    "delivery_id",
    "kind",
    "subject",
    "job_id",
    "policy",
    "asked",
    "recipient",
    "fallback",
    "reason",
    "channel",
    "address",
    "status",
)


def record(conn: Connection, rows: Sequence[Mapping[str, Any]], *, now: datetime) -> None:
    """Store notices (NOTICE_FIELDS each) made at ``now``."""
    if rows:
        conn.execute(
            insert(notices),
            [{f: r.get(f) for f in NOTICE_FIELDS} | {"created_at": now} for r in rows],
        )


def mark(
    conn: Connection, *, delivery_id: str, status: str, error: str | None, now: datetime
) -> None:
    """Follow the outcome of the delivery ``delivery_id`` (sent, failed, or still pending)."""
    values: dict[str, Any] = {"status": status, "error": error}
    if status == "sent":
        values["sent_at"] = now
    conn.execute(update(notices).where(notices.c.delivery_id == delivery_id).values(**values))


def prune(conn: Connection, *, before: datetime) -> int:
    """Delete notices made before ``before`` that are no longer pending; returns how many."""
    q = delete(notices).where(notices.c.created_at < before, notices.c.status != "pending")
    return int(conn.execute(q).rowcount or 0)


def delivered_ids(conn: Connection, *, delivery_ids: Sequence[str]) -> set[str]:
    """Which of ``delivery_ids`` were already queued (a message queued once per key)."""
    if not delivery_ids:
        return set()
    q = select(notices.c.delivery_id).where(notices.c.delivery_id.in_(list(delivery_ids)))
    return {r for (r,) in conn.execute(q)}


def list_notices(
    conn: Connection,
    *,
    job_id: str | None = None,
    asked: str | None = None,
    kind: str | None = None,
    status: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 200,
) -> list[NoticeRow]:
    """Notices newest first, filtered by job, addressee (user:alice), kind, status and time."""
    c = notices.c
    q = select(notices).order_by(c.created_at.desc(), c.id.desc()).limit(limit)
    for column, value in (
        (c.job_id, job_id),
        (c.asked, asked),
        (c.kind, kind),
        (c.status, status),
    ):
        if value is not None:
            q = q.where(column == value)
    if since is not None:
        q = q.where(c.created_at >= since)
    if until is not None:
        q = q.where(c.created_at < until)
    return [cast(NoticeRow, dict(r._mapping)) for r in conn.execute(q)]
