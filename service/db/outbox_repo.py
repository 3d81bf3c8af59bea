"""The durable notification outbox: enqueue, pick what is due, record each attempt's outcome."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Text, cast, delete, func, insert, select, update

from service.db.rows import NewOutboxRow
from service.db.schema import notices, outbox


def enqueue(conn: Connection, rows: Sequence[NewOutboxRow], *, now: datetime) -> None:
    """Queue deliveries (``delivery_id``, ``channel``, ``alert_id``, ``payload``) to send now."""
    if rows:
        conn.execute(
            insert(outbox),
            [
                {
                    **r,
                    "status": "pending",
                    "attempts": 0,
                    "next_attempt_at": now,
                    "created_at": now,
                }
                for r in rows
            ],
        )


@dataclass(frozen=True, slots=True)
class Due:
    """A pending delivery due now; ``unreadable`` says why its stored payload cannot be read,
    ``last_error`` why its last attempt failed (None before the first)."""

    id: int
    delivery_id: str
    channel: str
    attempts: int
    payload: Any
    unreadable: str | None = None
    last_error: str | None = None


def _read(text: str) -> tuple[Any, str | None]:
    try:
        return json.loads(text), None
    except (ValueError, RecursionError) as exc:  # RecursionError: nested past Python's limit
        return None, f"payload is not readable JSON ({type(exc).__name__})"


def due(conn: Connection, *, now: datetime, limit: int = 200) -> list[Due]:
    """Pending deliveries whose next attempt is due, oldest first.

    Payloads are read one by one, so one that cannot be read is reported on its own row
    instead of failing the whole read.
    """
    c = outbox.c
    q = (
        select(c.id, c.delivery_id, c.channel, c.attempts, cast(c.payload, Text), c.last_error)
        .where(c.status == "pending", c.next_attempt_at <= now)
        .order_by(c.id)
        .limit(limit)
    )
    out = []
    for row_id, delivery_id, channel, attempts, text, last_error in conn.execute(q):
        payload, unreadable = _read(text)
        out.append(Due(row_id, delivery_id, channel, attempts, payload, unreadable, last_error))
    return out


def mark_sent(conn: Connection, *, row_id: int, now: datetime) -> None:
    """Record a successful delivery."""
    conn.execute(
        update(outbox)
        .where(outbox.c.id == row_id)
        .values(status="sent", sent_at=now, attempts=outbox.c.attempts + 1, last_error=None)
    )


def mark_retry(conn: Connection, *, row_id: int, error: str, next_attempt_at: datetime) -> None:
    """Record a failed attempt that will be retried at ``next_attempt_at``."""
    conn.execute(
        update(outbox)
        .where(outbox.c.id == row_id)
        .values(attempts=outbox.c.attempts + 1, last_error=error, next_attempt_at=next_attempt_at)
    )


def mark_failed(conn: Connection, *, row_id: int, error: str) -> None:
    """Record a delivery that is given up on."""
    conn.execute(
        update(outbox)
        .where(outbox.c.id == row_id)
        .values(status="failed", attempts=outbox.c.attempts + 1, last_error=error)
    )


def sent_ids(conn: Connection, *, delivery_ids: Sequence[str]) -> set[str]:
    """Which of ``delivery_ids`` were delivered (status sent: taken by the receiver, not only
    queued); a failed, pending or pruned one (the outbox keeps a week) is not among them."""
    if not delivery_ids:
        return set()
    c = outbox.c
    q = select(c.delivery_id).where(c.delivery_id.in_(list(delivery_ids)), c.status == "sent")
    return {r for (r,) in conn.execute(q)}


def depth(conn: Connection) -> int:
    """Deliveries still pending."""
    q = select(func.count()).select_from(outbox).where(outbox.c.status == "pending")
    return int(conn.execute(q).scalar_one())


def prune(conn: Connection, *, before: datetime) -> int:
    """Delete sent and failed deliveries created before ``before``; returns how many."""
    q = delete(outbox).where(outbox.c.status != "pending", outbox.c.created_at < before)
    return int(conn.execute(q).rowcount or 0)


def statuses(conn: Connection, *, delivery_ids: Sequence[str]) -> dict[str, str]:
    """The status (pending, sent, failed) of each of ``delivery_ids`` the outbox still holds,
    else what the notices table recorded of it (it keeps a person's messages longer)."""
    if not delivery_ids:
        return {}
    ids = list(delivery_ids)
    out = {
        r.delivery_id: r.status
        for r in conn.execute(
            select(notices.c.delivery_id, notices.c.status).where(notices.c.delivery_id.in_(ids))
        )
    }
    for r in conn.execute(
        select(outbox.c.delivery_id, outbox.c.status).where(outbox.c.delivery_id.in_(ids))
    ):
        out[r.delivery_id] = r.status
    return out
