"""Storage of silences: matchers that mute alerts for a time span."""

from __future__ import annotations

from datetime import datetime
from typing import cast

from sqlalchemy import Connection, insert, select, update

from service.db.rows import SilenceRow
from service.db.schema import silences
from service.errors import NotFound
from service.thresholds.evaluator import Silence
from service.vocabulary import canonical_labels


def create_silence(
    conn: Connection,
    *,
    matchers: dict[str, str],
    starts_at: datetime,
    ends_at: datetime,
    comment: str,
    created_by: str | None,
    now: datetime,
) -> int:
    """Store a silence; returns its id."""
    return int(
        conn.execute(
            insert(silences)
            .values(
                matchers=canonical_labels(matchers),
                starts_at=starts_at,
                ends_at=ends_at,
                comment=comment,
                created_by=created_by,
                created_at=now,
            )
            .returning(silences.c.id)
        ).scalar_one()
    )


def list_silences(conn: Connection) -> list[SilenceRow]:
    """Every silence, newest first."""
    rows = conn.execute(select(silences).order_by(silences.c.id.desc()))
    return [cast(SilenceRow, dict(r._mapping)) for r in rows]


def expire_silence(conn: Connection, *, silence_id: int, now: datetime) -> None:
    """End silence ``silence_id`` now (kept for history); NotFound if absent."""
    row = conn.execute(select(silences.c.ends_at).where(silences.c.id == silence_id)).first()
    if row is None:
        raise NotFound(f"no silence with id {silence_id}")
    if row.ends_at > now:
        conn.execute(update(silences).where(silences.c.id == silence_id).values(ends_at=now))


def active_silences(conn: Connection, *, now: datetime) -> list[Silence]:
    """Silences in force at ``now``."""
    rows = conn.execute(
        select(silences).where(silences.c.starts_at <= now, silences.c.ends_at > now)
    )
    return [Silence(r.id, canonical_labels(r.matchers), r.starts_at, r.ends_at) for r in rows]
