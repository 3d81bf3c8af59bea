"""The per-test database reset (tests/conftest.py's truncate_all) leaves every table empty and
the id sequences restarted on both stores, as TRUNCATE ... RESTART IDENTITY CASCADE does."""

from __future__ import annotations

from sqlalchemy import Engine, func, select

from service.db.schema import metadata
from tests.conftest import truncate_all
from tests.support import store_a_job_on_a_gpu


def test_every_table_is_empty_and_ids_start_again(engine: Engine) -> None:
    store_a_job_on_a_gpu(engine)
    with engine.connect() as conn:
        held = {
            t.name
            for t in metadata.sorted_tables
            if conn.execute(select(func.count()).select_from(t)).scalar()
        }
    assert {"nodes", "gpus", "jobs", "job_gpus", "cost_day_dirty"} <= held

    truncate_all(engine)

    with engine.connect() as conn:
        left = {
            t.name: n
            for t in metadata.sorted_tables
            if (n := conn.execute(select(func.count()).select_from(t)).scalar())
        }
    assert left == {}
    assert store_a_job_on_a_gpu(engine) == 1
