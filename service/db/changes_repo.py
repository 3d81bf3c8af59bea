"""Who changed the configuration: one row per policy, ladder, channel, silence, price table or
owner change made through the API, naming the person or token behind it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, insert, select

from service.db.schema import config_changes

# What a row may say was changed, and how.
CHANGE_KINDS = ("policy", "ladder", "channel", "silence", "prices", "owner", "sessions")
CHANGE_ACTIONS = ("create", "update", "delete")


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """One change: when, who (``person:alice`` or ``token:<name>``), what kind, which one, how."""

    id: int
    at: datetime
    actor: str
    kind: str
    name: str
    action: str


def record(
    conn: Connection, *, actor: str, kind: str, name: str, action: str, now: datetime
) -> None:
    """Append one change to the log, in the transaction that made it."""
    conn.execute(
        insert(config_changes).values(at=now, actor=actor, kind=kind, name=name, action=action)
    )


def list_changes(
    conn: Connection, *, kind: str | None = None, actor: str | None = None, limit: int = 500
) -> list[ConfigChange]:
    """The newest ``limit`` changes, of ``kind`` and by ``actor`` where given."""
    c = config_changes.c
    query = select(config_changes).order_by(c.id.desc()).limit(limit)
    if kind is not None:
        query = query.where(c.kind == kind)
    if actor is not None:
        query = query.where(c.actor == actor)
    return [
        ConfigChange(r.id, r.at, r.actor, r.kind, r.name, r.action) for r in conn.execute(query)
    ]
