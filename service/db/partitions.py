"""Day partitions of PostgreSQL ``samples``: created ahead of data, dropped by retention."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import Connection, text

_NAME = re.compile(r"^samples_p(\d{8})$")
_PARTITION_LOCK_KEY = 0x67707577_70617274  # "gpuwpart"


def partition_name(day: date) -> str:
    """The name of the partition holding ``day`` (UTC)."""
    return f"samples_p{day:%Y%m%d}"


def existing_partitions(conn: Connection) -> dict[date, str]:
    """The day partitions that exist now, by day."""
    rows = conn.execute(
        text(
            "SELECT c.relname FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'samples'"
        )
    ).scalars()
    found: dict[date, str] = {}
    for name in rows:
        m = _NAME.match(name)
        if m:
            found[datetime.strptime(m.group(1), "%Y%m%d").date()] = name
    return found


def ensure_partitions(conn: Connection, days: Iterable[date]) -> list[str]:
    """Create the partitions for ``days`` that are missing; returns the names created."""
    # CREATE TABLE IF NOT EXISTS is not safe against a concurrent creator (replicas starting
    # together fail with DuplicateTable), so creators take turns for this transaction.
    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PARTITION_LOCK_KEY})
    created = []
    for day in sorted(set(days)):
        name = partition_name(day)
        lo = datetime(day.year, day.month, day.day, tzinfo=UTC)
        hi = lo + timedelta(days=1)
        conn.execute(
            text(
                f"CREATE TABLE IF NOT EXISTS {name} PARTITION OF samples "
                f"FOR VALUES FROM ('{lo.isoformat()}') TO ('{hi.isoformat()}')"
            )
        )
        created.append(name)
    return created


def drop_partitions_before(conn: Connection, cutoff: datetime) -> list[str]:
    """Drop every day partition that ends at or before ``cutoff``; returns the names dropped."""
    dropped = []
    for day, name in sorted(existing_partitions(conn).items()):
        end = datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(days=1)
        if end <= cutoff:
            conn.execute(text(f"DROP TABLE IF EXISTS {name}"))
            dropped.append(name)
    return dropped
