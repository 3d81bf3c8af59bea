"""Retention per resolution (day partitions dropped on PostgreSQL) and the schema-at-head checks."""

from __future__ import annotations

import asyncio
from datetime import date, timedelta

import httpx
import pytest
from sqlalchemy import Engine, func, select, text

from service.api.app import create_app
from service.db import partitions
from service.db.engine import make_engine
from service.db.migrate import check_at_head, upgrade
from service.db.schema import rollup_1h, rollup_1m, samples
from service.errors import SchemaOutOfDate
from service.settings import Settings
from service.usecases.upkeep import partitions_once, retention_once, rollup_once
from tests.support import FakeClock, live_server, make_batch


def n(engine: Engine, table) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def _partitions(engine: Engine) -> set[date]:
    if engine.dialect.name != "postgresql":
        return set()
    with engine.connect() as conn:
        return set(partitions.existing_partitions(conn))


def test_retention_keeps_each_resolution_for_its_time(
    app, http, tokens, engine: Engine, clock: FakeClock
):
    ctx = app.state.ctx
    h = {"Authorization": f"Bearer {tokens['agent']}"}
    for days_ago in (6, 3, 0):
        clock.set(clock.now)  # ingest checks against "now"
        batch = make_batch(start=clock() - timedelta(days=days_ago, minutes=10), count=6)
        assert http.post("/api/v1/ingest", json=batch, headers=h).status_code == 200
    rollup_once(ctx)
    assert n(engine, samples) == 18
    ctx.settings.retention_raw_days = 4
    ctx.settings.retention_1m_days = 5
    ctx.settings.retention_1h_days = 7
    before = _partitions(engine)
    done = retention_once(ctx)
    if engine.dialect.name == "postgresql":
        # Whole days go: the day 6 days back is dropped, not emptied; 3 days back and today stay.
        six, three, today = ((clock() - timedelta(days=d)).date() for d in (6, 3, 0))
        assert {six, three, today} <= before
        assert done["raw_partitions_dropped"] >= 1 and "raw_rows_deleted" not in done
        after = _partitions(engine)
        assert six not in after and {three, today} <= after
    with engine.connect() as conn:
        oldest_raw = conn.execute(select(func.min(samples.c.ts))).scalar_one()
        oldest_1m = conn.execute(select(func.min(rollup_1m.c.bucket_start))).scalar_one()
    # PostgreSQL drops whole days, so raw older than 4 days goes at day granularity
    assert oldest_raw > clock() - timedelta(days=4, hours=24)
    assert n(engine, samples) == 12
    assert oldest_1m > clock() - timedelta(days=5)
    assert n(engine, rollup_1h) >= 3  # all still inside 7 days
    clock.advance(8 * 86400)
    retention_once(ctx)
    assert n(engine, rollup_1h) == 0


def test_postgres_samples_are_partitioned_by_day(app, engine: Engine, clock: FakeClock):
    created = partitions_once(app.state.ctx)
    if engine.dialect.name == "sqlite":
        assert created == []  # SQLite has no partitions; retention deletes rows instead
        return
    with engine.begin() as conn:
        days = partitions.existing_partitions(conn)
        assert clock().date() in days and clock().date() + timedelta(days=2) in days
        kind = conn.execute(text("SELECT relkind FROM pg_class WHERE relname = 'samples'")).scalar()
        assert kind == "p"
        dropped = partitions.drop_partitions_before(conn, clock() + timedelta(days=1))
        assert partitions.partition_name(clock().date()) in dropped


def test_schema_out_of_date_is_refused_with_the_fix(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    with pytest.raises(SchemaOutOfDate, match="gpuwarden migrate"):
        check_at_head(engine)
    app = create_app(Settings(database_url=str(engine.url), run_scheduler=False), engine=engine)

    async def start_and_stop() -> None:
        async with app.router.lifespan_context(app):
            pass

    with pytest.raises(SchemaOutOfDate):
        asyncio.run(start_and_stop())
    upgrade(engine)
    check_at_head(engine)
    with live_server(app) as url:
        assert httpx.get(f"{url}/readyz").json() == {"status": "ready"}
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = 'old'"))
        r = httpx.get(f"{url}/readyz")
        assert r.status_code == 503 and "gpuwarden migrate" in r.json()["detail"]
    engine.dispose()
