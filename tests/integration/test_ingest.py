"""Ingest over real HTTP into SQLite and PostgreSQL: idempotence, atomicity, validation, access."""

from __future__ import annotations

import gzip
import json
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import Engine, func, select

from service.db.schema import gpus, nodes, rollup_dirty, samples
from tests.support import FakeClock, auth, iso, make_batch


def count(engine: Engine, table) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def test_batch_is_stored_and_readable(http: httpx.Client, tokens, engine: Engine, clock: FakeClock):
    batch = make_batch(
        gpu_uuids=("GPU-a0", "GPU-a1"), start=clock() - timedelta(minutes=2), count=10
    )
    r = http.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"]))
    assert r.status_code == 200, r.text
    assert r.json() == {
        "samples_received": 20,
        "samples_stored": 20,
        "processes_received": 0,
        "gpus": 2,
        "gpu_claims": [],
    }
    assert count(engine, samples) == 20
    assert count(engine, nodes) == 1
    assert count(engine, rollup_dirty) > 0

    listed = http.get("/api/v1/gpus", headers=auth(tokens["reader"])).json()
    assert [g["uuid"] for g in listed] == ["GPU-a0", "GPU-a1"]
    assert listed[0]["node"] == "node-a"
    assert listed[0]["latest"]["sm_active"] == 0.5
    assert listed[0]["last_seen_at"] == iso(clock() - timedelta(minutes=2) + timedelta(seconds=90))


def test_same_batch_twice_is_stored_once(
    http: httpx.Client, tokens, engine: Engine, clock: FakeClock
):
    batch = make_batch(start=clock() - timedelta(minutes=1), count=5)
    for stored in (5, 0):
        r = http.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"]))
        assert r.status_code == 200, r.text
        assert (r.json()["samples_received"], r.json()["samples_stored"]) == (5, stored)
    assert count(engine, samples) == 5
    assert count(engine, gpus) == 1


def test_batch_overlapping_a_stored_one_stores_only_its_new_samples(
    http: httpx.Client, tokens, engine: Engine, clock: FakeClock
):
    # PostgreSQL writes a batch by COPY; one that repeats stored samples falls back to an
    # insert that skips them, in the same transaction, with every value as sent.
    start = clock() - timedelta(minutes=2)
    metrics = {"sm_active": 0.25, "fb_used_bytes": 2**40 + 3, "power_watts": 312.5}
    first = make_batch(start=start, count=4, metrics=metrics)
    again = make_batch(start=start + timedelta(seconds=20), count=4, metrics=metrics)
    got = []
    for batch in (first, again):
        r = http.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"]))
        assert r.status_code == 200, r.text
        got.append((r.json()["samples_received"], r.json()["samples_stored"]))
    assert got == [(4, 4), (4, 2)]
    with engine.connect() as conn:
        rows = conn.execute(
            select(samples.c.ts, samples.c.sm_active, samples.c.fb_used_bytes,
                   samples.c.power_watts, samples.c.source, samples.c.cause)
            .order_by(samples.c.ts)
        ).all()  # fmt: skip
    assert [r.ts for r in rows] == [start + timedelta(seconds=10 * k) for k in range(6)]
    assert {(r.sm_active, r.fb_used_bytes, r.power_watts, r.source) for r in rows} == {
        (0.25, 2**40 + 3, 312.5, "gpm")
    }
    assert all(r.cause is not None for r in rows)


def test_gzip_body_is_accepted(http: httpx.Client, tokens, engine: Engine, clock: FakeClock):
    body = gzip.compress(json.dumps(make_batch(start=clock(), count=3)).encode())
    r = http.post(
        "/api/v1/ingest",
        content=body,
        headers={
            **auth(tokens["agent"]),
            "Content-Encoding": "gzip",
            "Content-Type": "application/json",
        },
    )
    assert r.status_code == 200, r.text
    assert count(engine, samples) == 3


def test_one_bad_item_rejects_the_whole_batch_and_names_it(
    http: httpx.Client, tokens, engine: Engine, clock: FakeClock
):
    good = make_batch(start=clock() - timedelta(minutes=5), count=2)
    assert http.post("/api/v1/ingest", json=good, headers=auth(tokens["agent"])).status_code == 200
    batch = make_batch(start=clock() - timedelta(minutes=1), count=6)
    batch["samples"][4]["metrics"] = {"sm_active": 1.7}
    r = http.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"]))
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert detail[0]["loc"] == ["body", "samples", 4, "metrics", "sm_active"]
    assert "less than or equal to 1" in detail[0]["msg"]
    assert count(engine, samples) == 2  # nothing of the bad batch, nothing already stored lost


def test_validation_errors_name_item_and_reason(http: httpx.Client, tokens, clock: FakeClock):
    cases: list[tuple[dict[str, Any], str | None, list[Any]]] = [
        ({"bogus_metric": 1.0}, None, ["body", "samples", 0, "metrics", "bogus_metric"]),
        ({"fb_used_bytes": -5}, None, ["body", "samples", 0, "metrics", "fb_used_bytes"]),
        ({"sm_active": 0.2}, "2026-12-02T07:59:00", ["body", "samples", 0, "ts"]),
        ({"sm_active": 0.2}, iso(clock() + timedelta(minutes=6)), ["body", "samples", 0, "ts"]),
        ({"sm_active": 0.2}, iso(clock() - timedelta(days=8)), ["body", "samples", 0, "ts"]),
    ]
    for metrics, ts, loc in cases:
        batch = make_batch(start=clock(), metrics=metrics)
        if ts is not None:
            batch["samples"][0]["ts"] = ts
        r = http.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"]))
        assert r.status_code == 422, (metrics, ts, r.text)
        assert r.json()["detail"][0]["loc"] == loc, r.text


def test_unknown_gpu_in_samples_is_named(http: httpx.Client, tokens, clock: FakeClock):
    batch = make_batch(start=clock())
    batch["samples"][0]["gpu_uuid"] = "GPU-nowhere"
    r = http.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"]))
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "samples", 0, "gpu_uuid"]


def test_agent_cannot_write_for_another_node_or_its_gpus(
    http: httpx.Client, tokens, engine: Engine, clock: FakeClock
):
    from tests.conftest import make_token

    r = http.post(
        "/api/v1/ingest",
        json=make_batch(hostname="node-b", start=clock()),
        headers=auth(tokens["agent"]),
    )
    assert r.status_code == 403
    assert "node.hostname" in r.json()["detail"]

    assert (
        http.post(
            "/api/v1/ingest", json=make_batch(start=clock()), headers=auth(tokens["agent"])
        ).status_code
        == 200
    )
    token_b = make_token(engine, "agent", "node-b")
    stolen = make_batch(
        hostname="node-b", gpu_uuids=("GPU-a0",), start=clock() + timedelta(seconds=10)
    )
    # node-a still reports GPU-a0: node-b's claim on it is left out, nothing else refused.
    r = http.post("/api/v1/ingest", json=stolen, headers=auth(token_b))
    assert r.status_code == 200, r.text
    (claim,) = r.json()["gpu_claims"]
    assert claim["gpu_uuid"] == "GPU-a0" and not claim["moved"]
    assert count(engine, samples) == 1


def test_body_over_the_limit_is_413(app, http: httpx.Client, tokens, clock: FakeClock):
    app.state.ctx.settings.ingest_max_body_bytes = 2000
    big = make_batch(start=clock() - timedelta(minutes=3), count=40)
    r = http.post("/api/v1/ingest", json=big, headers=auth(tokens["agent"]))
    assert r.status_code == 413
    bomb = gzip.compress(json.dumps(big).encode())
    assert len(bomb) < 2000
    r = http.post(
        "/api/v1/ingest",
        content=bomb,
        headers={**auth(tokens["agent"]), "Content-Encoding": "gzip"},
    )
    assert r.status_code == 413


def test_roles(http: httpx.Client, tokens, engine: Engine, clock: FakeClock):
    batch = make_batch(start=clock())
    assert http.post("/api/v1/ingest", json=batch).status_code == 401
    assert http.post("/api/v1/ingest", json=batch, headers=auth("gw_wrong")).status_code == 401
    assert (
        http.post("/api/v1/ingest", json=batch, headers=auth(tokens["reader"])).status_code == 403
    )
    assert http.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"])).status_code == 200
    # admin may ingest for any node
    other = make_batch(hostname="node-z", gpu_uuids=("GPU-z0",), start=clock())
    assert http.post("/api/v1/ingest", json=other, headers=auth(tokens["admin"])).status_code == 200

    assert http.get("/api/v1/gpus").status_code == 401
    assert http.get("/api/v1/gpus", headers=auth(tokens["agent"])).status_code == 403
    assert http.get("/api/v1/gpus", headers=auth(tokens["reader"])).status_code == 200
    assert http.get("/api/v1/gpus", headers=auth(tokens["admin"])).status_code == 200
    # open endpoints
    assert http.get("/healthz").status_code == 200
    assert http.get("/readyz").json() == {"status": "ready"}
    assert http.get("/metrics").status_code == 200


def test_revoked_token_is_refused(http: httpx.Client, tokens, engine: Engine, clock: FakeClock):
    from service.db import tokens_repo

    with engine.begin() as conn:
        agent = next(t for t in tokens_repo.list_tokens(conn) if t.role == "agent")
        tokens_repo.revoke_token(conn, token_id=agent.id, now=clock())
    r = http.post("/api/v1/ingest", json=make_batch(start=clock()), headers=auth(tokens["agent"]))
    assert r.status_code == 401


def test_gpu_lost_then_back_and_attribute_changes(
    http: httpx.Client, tokens, engine: Engine, clock: FakeClock
):
    h = auth(tokens["agent"])
    batch = make_batch(start=clock())
    assert http.post("/api/v1/ingest", json=batch, headers=h).status_code == 200
    batch = make_batch(start=clock() + timedelta(seconds=10))
    batch["gpus"][0]["lost"] = True
    batch["gpus"][0]["fb_total_bytes"] = 1234
    assert http.post("/api/v1/ingest", json=batch, headers=h).status_code == 200
    listed = http.get("/api/v1/gpus", headers=auth(tokens["reader"])).json()
    assert listed[0]["lost"] is True and listed[0]["fb_total_bytes"] == 1234
    batch = make_batch(start=clock() + timedelta(seconds=20))
    assert http.post("/api/v1/ingest", json=batch, headers=h).status_code == 200
    listed = http.get("/api/v1/gpus", headers=auth(tokens["reader"])).json()
    assert listed[0]["lost"] is False


def test_rejected_batch_of_a_new_node_leaves_nothing_behind(
    http: httpx.Client, tokens, engine: Engine, clock: FakeClock
):
    from tests.conftest import make_token

    assert (
        http.post(
            "/api/v1/ingest", json=make_batch(start=clock()), headers=auth(tokens["agent"])
        ).status_code
        == 200
    )
    token_b = make_token(engine, "agent", "node-b")
    bad = make_batch(hostname="node-b", gpu_uuids=("GPU-b0",), start=clock())
    bad["samples"].append({**bad["samples"][0], "gpu_uuid": "GPU-zz"})  # a GPU it never listed
    assert http.post("/api/v1/ingest", json=bad, headers=auth(token_b)).status_code == 422
    assert count(engine, nodes) == 1  # node-b's row was rolled back with the batch
    # A GPU node-a still reports is left out of node-b's batch; node-b's own GPU is stored.
    mixed = make_batch(hostname="node-b", gpu_uuids=("GPU-b0", "GPU-a0"), start=clock())
    r = http.post("/api/v1/ingest", json=mixed, headers=auth(token_b))
    assert r.status_code == 200, r.text
    assert count(engine, nodes) == 2 and count(engine, gpus) == 2
