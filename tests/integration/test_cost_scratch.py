"""Scratch tables hold exactly the rows loaded into them (on PostgreSQL by a binary COPY with
the columns' types), and ``pg_local`` settings hold inside their block only, on both stores."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from sqlalchemy import Engine, select

from service.db.cost_scratch import fill, scratch_table
from service.db.costing.raw_sums import pg_local

_TABLE = scratch_table(
    "gw_test_scratch",
    ("k", "gpu_id", "at", "until", "w"),
    timestamps={"at", "until"},
    integers={"k", "gpu_id"},
)


def test_a_scratch_table_reads_back_the_rows_loaded(engine: Engine) -> None:
    at = datetime(2026, 12, 7, 10, 31, 47, 123_456, tzinfo=UTC)
    east = timezone(timedelta(hours=2))
    rows = [
        (0, 7, at, at + timedelta(microseconds=1), 1.0 / 3.0),
        (1, 2_000_000_000, at.astimezone(east), None, 1e300),
        (2, 0, at - timedelta(days=400), at, 2),  # an int in a float column
        (3, 1, None, None, None),
    ]
    with engine.begin() as conn:
        fill(conn, _TABLE, rows)
        fill(conn, _TABLE, rows[1:])  # a second fill replaces the first
        got = conn.execute(select(_TABLE).order_by(_TABLE.c.k)).all()
    assert [tuple(r) for r in got] == [
        (1, 2_000_000_000, at, None, 1e300),
        (2, 0, at - timedelta(days=400), at, 2.0),
        (3, 1, None, None, None),
    ]
    assert isinstance(got[1].w, float)


def test_pg_local_settings_hold_inside_their_block_only(engine: Engine) -> None:
    with engine.begin() as conn:
        pg = conn.dialect.name == "postgresql"

        def show(name: str) -> str | None:
            return str(conn.exec_driver_sql(f"SHOW {name}").scalar_one()) if pg else None

        before = (show("jit"), show("work_mem"), show("enable_hashjoin"))
        with pg_local(conn, jit="off", work_mem="'64MB'", enable_hashjoin="off"):
            inside = (show("jit"), show("work_mem"), show("enable_hashjoin"))
        after = (show("jit"), show("work_mem"), show("enable_hashjoin"))
    assert after == before
    if pg:
        assert inside == ("off", "64MB", "off")
        assert before != inside
