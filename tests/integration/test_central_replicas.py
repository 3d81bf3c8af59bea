"""Several central processes on one database: ingest through any of them, background jobs that
rewrite shared rows run on one at a time."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import Engine, func, select, text

from service.api.app import create_app
from service.db.leader import LOCK_KEY, job_lock_key
from service.db.schema import rollup_1m, rollup_dirty, samples
from service.scheduler import build_scheduler, one_replica_at_a_time, run_job, shard_by_shard
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
    elsewhere = ctx.telemetry.job_runs.labels("rollup", "elsewhere")
    if engine.dialect.name == "postgresql":
        # Another replica's rollup holds the turn: this one leaves the dirty minutes alone.
        with engine.connect() as holder:
            holder.execute(text("SELECT pg_advisory_lock(:k)"), {"k": job_lock_key("rollup")})
            before = elsewhere._value.get()
            assert run_job(ctx, "rollup", job) is None
            assert elsewhere._value.get() == before + 1
            assert n(engine, rollup_dirty) > 0 and n(engine, rollup_1m) == 0
            holder.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": job_lock_key("rollup")})
            holder.commit()
    buckets = run_job(ctx, "rollup", job)
    assert isinstance(buckets, int) and buckets > 0
    assert n(engine, rollup_dirty) == 0 and n(engine, rollup_1m) > 0


def _count(ctx: Any, task: str, outcome: str) -> float:
    return float(ctx.telemetry.job_runs.labels(task, outcome)._value.get())


def _timed(ctx: Any, task: str) -> float:
    return float(ctx.telemetry.job_seconds.labels(task)._sum.get())


def test_a_tick_on_a_replica_that_is_not_the_leader_counts_as_elsewhere(app, engine: Engine):
    """Leader-only rounds on a follower, and a rollup whose turn another replica holds, are
    counted ``elsewhere`` (not ``skipped``, which says a task falls behind) and left untimed."""
    if engine.dialect.name != "postgresql":
        return  # SQLite has one process: it is always the leader
    ctx = app.state.ctx
    sched = build_scheduler(ctx)
    ticks = {job.id: job.args for job in sched.get_jobs()}
    with engine.connect() as leader:  # another replica is the evaluator's leader
        assert leader.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY}).scalar()
        leader.commit()
        for task in ("evaluate", "ladder", "deliver", "reports"):
            before = (_count(ctx, task, "elsewhere"), _count(ctx, task, "ok"), _timed(ctx, task))
            assert run_job(*ticks[task]) is None
            after = (_count(ctx, task, "elsewhere"), _count(ctx, task, "ok"), _timed(ctx, task))
            assert after == (before[0] + 1, before[1], before[2]), task
        leader.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
        leader.commit()
    # The lock is free: this replica becomes the leader and its rounds run, counted and timed.
    ok, timed = _count(ctx, "evaluate", "ok"), _timed(ctx, "evaluate")
    run_job(*ticks["evaluate"])
    assert _count(ctx, "evaluate", "ok") == ok + 1
    assert _timed(ctx, "evaluate") > timed
    for hook in ctx.shutdown_hooks:
        hook()


def _rolled_gpus(engine: Engine) -> set[int]:
    with engine.connect() as conn:
        return {int(g) for (g,) in conn.execute(select(rollup_1m.c.gpu_id).distinct())}


def _dirty_gpus(engine: Engine) -> set[int]:
    with engine.connect() as conn:
        return {int(g) for (g,) in conn.execute(select(rollup_dirty.c.gpu_id).distinct())}


def test_a_rollup_in_shards_shares_a_round_between_replicas(
    app, http, tokens, engine: Engine, clock: FakeClock
):
    """Split in 4 shards by GPU id: a shard another replica holds is left to it, the rest
    rolled up; two replicas at once roll up every minute once."""
    ctx = app.state.ctx
    h = {"Authorization": f"Bearer {tokens['agent']}"}
    uuids = tuple(f"GPU-s{i}" for i in range(8))
    batch = make_batch(start=clock() - timedelta(minutes=5), count=12, gpu_uuids=uuids)
    assert http.post("/api/v1/ingest", json=batch, headers=h).status_code == 200
    gpu_ids = _dirty_gpus(engine)
    assert len(gpu_ids) == 8
    job = shard_by_shard(ctx, "rollup", 4, lambda shard: rollup_once(ctx, shard=shard))
    if engine.dialect.name == "postgresql":
        key = job_lock_key("rollup:1/4")
        with engine.connect() as holder:
            holder.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
            assert (done := run_job(ctx, "rollup", job)) and isinstance(done, int)
            assert _dirty_gpus(engine) == {g for g in gpu_ids if g % 4 == 1}
            assert _rolled_gpus(engine) == {g for g in gpu_ids if g % 4 != 1}
            holder.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            holder.commit()
    assert (done := run_job(ctx, "rollup", job)) and isinstance(done, int)
    assert _dirty_gpus(engine) == set() and _rolled_gpus(engine) == gpu_ids
    with engine.connect() as conn:
        alone = conn.execute(select(rollup_1m).order_by("gpu_id", "bucket_start")).all()

    if engine.dialect.name != "postgresql":
        return  # SQLite serves one process: there are no other replicas
    # The same minutes again, marked dirty, rolled up by two replicas' rounds at once.
    keys = {(r.gpu_id, r.bucket_start) for r in alone}
    with engine.begin() as conn:
        conn.execute(rollup_dirty.insert(), [{"gpu_id": g, "bucket_start": b} for g, b in keys])
    url = engine.url.render_as_string(hide_password=False)
    other = create_app(Settings(database_url=url, run_scheduler=False), engine=engine,
                       clock=clock).state.ctx  # fmt: skip

    def round_of(c: Any) -> object:
        return run_job(c, "rollup", shard_by_shard(
            c, "rollup", 4, lambda shard: rollup_once(c, shard=shard)))  # fmt: skip

    with ThreadPoolExecutor(2) as pool:
        counts = list(pool.map(round_of, (ctx, other)))
    assert sum(c for c in counts if isinstance(c, int)) == len(keys)
    with engine.connect() as conn:
        again = conn.execute(select(rollup_1m).order_by("gpu_id", "bucket_start")).all()
    assert [r._mapping for r in again] == [r._mapping for r in alone]


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
