"""Console sessions ended by logging out, kept until their cookie would have expired."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, delete, select
from sqlalchemy.exc import IntegrityError

from service.db.schema import ended_sessions


def end_session(conn: Connection, *, nonce: str, expires_at: datetime, now: datetime) -> None:
    """Record the session ``nonce`` as ended, and forget ended sessions that expired by ``now``."""
    conn.execute(delete(ended_sessions).where(ended_sessions.c.expires_at <= now))
    try:
        with conn.begin_nested():
            conn.execute(ended_sessions.insert().values(nonce=nonce, expires_at=expires_at))
    except IntegrityError:
        pass  # logged out twice (or on two replicas at once): already recorded


def is_ended(conn: Connection, *, nonce: str) -> bool:
    """Whether the session ``nonce`` was ended by logging out."""
    found = conn.execute(
        select(ended_sessions.c.nonce).where(ended_sessions.c.nonce == nonce)
    ).first()
    return found is not None
