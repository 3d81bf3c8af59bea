"""Several central processes on one database: ingest through any of them, background jobs that
rewrite shared rows run on one at a time."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import Engine, func, select, text

from service.api.app import create_app
from service.db.leader import job_lock_key
from service.db.schema import rollup_1m, rollup_dirty, samples
from service.scheduler import one_replica_at_a_time, run_job
from service.settings import Settings
from service.usecases.upkeep import rollup_once
from tests.conftest import make_token
from tests.support import FakeClock, live_server, make_batch


def n(engine: Engine, table) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def test_batches_through_two_replicas_are_stored_once(
    app, server: str, settings: Settings, tokens, engine: Engine, clock: FakeClock
):
    # A second process's app on the same database: its own caches, admission and telemetry.
    other = create_app(settings, engine=engine, clock=clock)
    h = {"Authorization": f"Bearer {tokens['agent']}"}
    start = clock() - timedelta(minutes=10)
    with live_server(other) as second:
        answers = []
        for k in range(6):
            # A load balancer sends consecutive batches of one node to either replica, and a
            # batch sent again (its answer lost) to the other one.
            batch = make_batch(start=start + timedelta(seconds=30 * k), count=3)
            for base in (server, second) if k % 2 else (second, server):
                r = httpx.post(f"{base}/api/v1/ingest", json=batch, headers=h, timeout=30)
                assert r.status_code == 200, r.text
                answers.append(r.json()["samples_stored"])
    assert answers == [3, 0] * 6
    assert n(engine, samples) == 18
    assert rollup_once(other.state.ctx) > 0 and n(engine, rollup_dirty) == 0


def test_the_rollup_runs_on_one_replica_at_a_time(
    app, http, tokens, engine: Engine, clock: FakeClock
):
    ctx = app.state.ctx
    h = {"Authorization": f"Bearer {tokens['agent']}"}
    batch = make_batch(start=clock() - timedelta(minutes=5), count=6)
    assert http.post("/api/v1/ingest", json=batch, headers=h).status_code == 200
    job = one_replica_at_a_time(ctx, "rollup", lambda: rollup_once(ctx))
    skipped = ctx.telemetry.job_runs.labels("rollup", "skipped")
    if engine.dialect.name == "postgresql":
        # Another replica's rollup holds the turn: this one leaves the dirty minutes alone.
        with engine.connect() as holder:
            holder.execute(text("SELECT pg_advisory_lock(:k)"), {"k": job_lock_key("rollup")})
            before = skipped._value.get()
            assert run_job(ctx, "rollup", job) is None
            assert skipped._value.get() == before + 1
            assert n(engine, rollup_dirty) > 0 and n(engine, rollup_1m) == 0
            holder.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": job_lock_key("rollup")})
            holder.commit()
    buckets = run_job(ctx, "rollup", job)
    assert isinstance(buckets, int) and buckets > 0
    assert n(engine, rollup_dirty) == 0 and n(engine, rollup_1m) > 0


def test_a_gpu_moved_through_another_replica_is_seen_by_this_one(
    app, server: str, settings: Settings, tokens, engine: Engine, clock: FakeClock
):
    other = create_app(settings, engine=engine, clock=clock)
    node_a = {"Authorization": f"Bearer {tokens['agent']}"}
    node_b = {"Authorization": f"Bearer {make_token(engine, 'agent', 'node-b')}"}

    def post(base: str, hostname: str, h: dict[str, str]) -> dict[str, Any]:
        batch = make_batch(hostname=hostname, gpu_uuids=("GPU-a0",), start=clock())
        r = httpx.post(f"{base}/api/v1/ingest", json=batch, headers=h, timeout=30)
        assert r.status_code == 200, r.text
        return dict(r.json())

    with live_server(other) as second:
        assert post(server, "node-a", node_a)["gpu_claims"] == []  # this replica caches the GPU
        clock.advance(600)  # node-a stops reporting it; node-b, through the other replica, takes it
        assert post(second, "node-b", node_b)["gpu_claims"][0]["moved"]
        clock.advance(10)
        assert post(second, "node-b", node_b)["gpu_claims"] == []
        # node-a's agent (reading node-b's GPU now) through the first replica: its cache of the
        # GPU is older than the re-check interval, so it reads the owner again and leaves it out.
        body = post(server, "node-a", node_a)
    assert body["samples_stored"] == 0
    assert [(c["gpu_uuid"], c["moved"]) for c in body["gpu_claims"]] == [("GPU-a0", False)]
