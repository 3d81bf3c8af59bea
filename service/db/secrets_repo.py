"""Secrets the service makes for itself, one row per name, created once and then only read."""

from __future__ import annotations

import secrets
from datetime import datetime

from sqlalchemy import Connection, select
from sqlalchemy.exc import IntegrityError

from service.db.schema import service_secrets


def get_or_create(conn: Connection, *, name: str, now: datetime) -> str:
    """The secret called ``name`` (URL-safe text, 256 random bits), made now if there is none.

    Two replicas starting at once may both try to insert; the primary key lets one win and the
    other reads the winner's value, so both sign alike.
    """
    value = conn.execute(
        select(service_secrets.c.value).where(service_secrets.c.name == name)
    ).scalar_one_or_none()
    if value is not None:
        return str(value)
    fresh = secrets.token_urlsafe(32)
    try:
        with conn.begin_nested():
            conn.execute(service_secrets.insert().values(name=name, value=fresh, created_at=now))
    except IntegrityError:
        pass
    return str(
        conn.execute(
            select(service_secrets.c.value).where(service_secrets.c.name == name)
        ).scalar_one()
    )
