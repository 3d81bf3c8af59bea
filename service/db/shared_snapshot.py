"""A second connection that reads what a first one reads: on PostgreSQL it imports the first
transaction's snapshot, so a request's reads split over two connections still see one state."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection


@contextmanager
def connect_beside(conn: Connection) -> Iterator[Connection]:
    """A connection of ``conn``'s engine reading ``conn``'s snapshot (PostgreSQL), with its
    statement timeout; ``conn``'s transaction must stay open while the block reads. On other
    databases a plain connection."""
    if conn.dialect.name != "postgresql":
        with conn.engine.connect() as other:
            yield other
        return
    snapshot, timeout, read_only = conn.exec_driver_sql(
        "SELECT pg_export_snapshot(), current_setting('statement_timeout'), "
        "current_setting('transaction_read_only')"
    ).one()
    with conn.engine.connect() as other:
        # REPEATABLE READ keeps the imported snapshot for every statement of the block; READ
        # ONLY where the first is (a writable transaction cannot import a read-only one's).
        access = ", READ ONLY" if read_only == "on" else ""
        other.exec_driver_sql(f"SET TRANSACTION ISOLATION LEVEL REPEATABLE READ{access}")
        other.exec_driver_sql(f"SET TRANSACTION SNAPSHOT '{snapshot}'")
        other.exec_driver_sql(f"SET LOCAL statement_timeout = '{timeout}'")
        yield other
