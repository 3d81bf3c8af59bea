"""The one dialect-specific statement we need: INSERT that skips rows already present."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, Insert, Table
from sqlalchemy.dialects import postgresql, sqlite


def insert_ignore(conn: Connection, table: Table, index_elements: Sequence[str]) -> Insert:
    """``INSERT ... ON CONFLICT (index_elements) DO NOTHING`` for the connection's dialect."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing(index_elements=list(index_elements))
    return sqlite.insert(table).on_conflict_do_nothing(index_elements=list(index_elements))
