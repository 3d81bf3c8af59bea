"""Matching many (GPU, bucket) keys at once (the rollup job's deletes, a report's cut minutes):
the right rows on both stores, and on SQLite by the primary key, never a scan of the table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from sqlalchemy import Engine, delete, func, insert, select

from service.db.dialect import keys_in
from service.db.schema import rollup_dirty

T0 = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)


def test_five_hundred_keys_match_their_rows_by_the_primary_key(engine: Engine) -> None:
    every = [(g, T0 + timedelta(minutes=m)) for g in range(1, 5) for m in range(400)]
    rows = [{"gpu_id": g, "bucket_start": b} for g, b in every]
    keys = every[::3][:500]
    with engine.begin() as conn:
        conn.execute(insert(rollup_dirty), rows)
        query = (
            select(func.count()).select_from(rollup_dirty).where(keys_in(conn, rollup_dirty, keys))
        )
        assert conn.execute(query).scalar_one() == 500
        if engine.dialect.name == "sqlite":
            sql = str(query.compile(conn, compile_kwargs={"literal_binds": True}))
            plan = [row[3] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}")]
            assert not any(step.startswith("SCAN") for step in plan), plan
        conn.execute(delete(rollup_dirty).where(keys_in(conn, rollup_dirty, keys)))
        left = set(conn.execute(select(rollup_dirty.c.gpu_id, rollup_dirty.c.bucket_start)).all())
    assert len(left) == len(rows) - 500 and not left & set(keys)


def test_keys_given_in_another_zone_match_the_same_instants(engine: Engine) -> None:
    tokyo = timezone(timedelta(hours=9))
    every = [(g, T0 + timedelta(minutes=m)) for g in range(1, 3) for m in range(10)]
    with engine.begin() as conn:
        conn.execute(insert(rollup_dirty), [{"gpu_id": g, "bucket_start": b} for g, b in every])
        keys = [(g, b.astimezone(tokyo)) for g, b in every[::2]]
        conn.execute(delete(rollup_dirty).where(keys_in(conn, rollup_dirty, keys)))
        left = set(conn.execute(select(rollup_dirty.c.gpu_id, rollup_dirty.c.bucket_start)).all())
    assert left == set(every[1::2])
