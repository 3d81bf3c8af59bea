"""Console sessions ended by logging out, kept until their cookie would have expired; and the
sessions of a person an admin signed out everywhere."""

from __future__ import annotations

import hashlib
from datetime import datetime

from sqlalchemy import Connection, delete, select, update
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


def _person_key(user: str) -> str:
    """The ended_sessions key that marks ``user``'s sessions ended (fits its 64 characters)."""
    return "person:" + hashlib.sha256(user.encode()).hexdigest()[:56]


def end_person_sessions(conn: Connection, *, user: str, until: datetime, now: datetime) -> None:
    """End every session of the person ``user`` that expires by ``until`` (every session made
    before now, when ``until`` is now plus the session lifetime); later sign-ins pass."""
    conn.execute(delete(ended_sessions).where(ended_sessions.c.expires_at <= now))
    key = _person_key(user)
    found = conn.execute(
        select(ended_sessions.c.expires_at).where(ended_sessions.c.nonce == key)
    ).first()
    if found is None:
        conn.execute(ended_sessions.insert().values(nonce=key, expires_at=until))
    elif found.expires_at < until:
        conn.execute(
            update(ended_sessions).where(ended_sessions.c.nonce == key).values(expires_at=until)
        )


def person_ended(conn: Connection, *, user: str, expires_at: datetime) -> bool:
    """Whether an admin ended the sessions of ``user`` after the one expiring at ``expires_at``
    was made."""
    found = conn.execute(
        select(ended_sessions.c.expires_at).where(ended_sessions.c.nonce == _person_key(user))
    ).first()
    return found is not None and expires_at <= found.expires_at
