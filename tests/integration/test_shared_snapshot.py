"""A second connection beside a first: on PostgreSQL it reads the first one's snapshot (rows
committed since are not seen, whether the first is read-only or not), on SQLite it is a plain
connection of the same engine."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import Connection, Engine, func, insert, select

from service.db.schema import nodes
from service.db.shared_snapshot import connect_beside

AT = datetime(2026, 12, 1, tzinfo=UTC)


def _count(conn: Connection) -> int:
    return int(conn.execute(select(func.count()).select_from(nodes)).scalar_one())


@pytest.mark.parametrize("access", ["", ", READ ONLY"])
def test_the_second_connection_reads_the_first_one_s_snapshot(engine: Engine, access: str) -> None:
    """A node committed after the first connection's snapshot is not seen beside it on
    PostgreSQL; on SQLite the plain connection sees it."""
    pg = engine.dialect.name == "postgresql"
    with engine.connect() as first:
        if pg:
            first.exec_driver_sql(f"SET TRANSACTION ISOLATION LEVEL REPEATABLE READ{access}")
        before = _count(first)
        with engine.begin() as writer:
            writer.execute(
                insert(nodes).values(hostname="node-later", labels={}, first_seen_at=AT,
                                     last_seen_at=AT)
            )  # fmt: skip
        with connect_beside(first) as other:
            seen = _count(other)
    assert seen == (before if pg else before + 1)
