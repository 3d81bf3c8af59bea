"""The per-test database reset (tests/conftest.py's truncate_all) leaves every table empty and
the id sequences restarted on both stores, as TRUNCATE ... RESTART IDENTITY CASCADE does."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import Engine, func, insert, select

from service.db.schema import gpus, job_gpus, jobs, metadata, nodes
from tests.conftest import truncate_all

T0 = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)


def _store_a_job_on_a_gpu(engine: Engine) -> int:
    """A node, a GPU and a job on it (its job_gpus row marks a day dirty); the node's id."""
    with engine.begin() as conn:
        node_id = conn.execute(
            insert(nodes)
            .values(hostname="n1", labels={}, first_seen_at=T0, last_seen_at=T0)
            .returning(nodes.c.id)
        ).scalar_one()
        gpu_id = conn.execute(
            insert(gpus)
            .values(uuid="GPU-0", node_id=node_id, gpu_index=0, model="H100", first_seen_at=T0)
            .returning(gpus.c.id)
        ).scalar_one()
        conn.execute(
            insert(jobs).values(
                id="slurm:1", labels={}, source="api", started_at=T0, created_at=T0, updated_at=T0
            )
        )
        conn.execute(
            insert(job_gpus).values(job_id="slurm:1", gpu_id=gpu_id, started_at=T0, source="api")
        )
    return int(node_id)


def test_every_table_is_empty_and_ids_start_again(engine: Engine) -> None:
    _store_a_job_on_a_gpu(engine)
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
    assert _store_a_job_on_a_gpu(engine) == 1
