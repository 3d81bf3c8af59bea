"""The agent against a real central service on loopback: lost GPU, spool cap, the delivery table."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import httpx
from fastapi import FastAPI
from sqlalchemy import Engine, func, select

from service.collectors.agent import Agent, AgentConfig
from service.collectors.batch import encode
from service.collectors.simulated import SimulatedBackend
from service.collectors.spool import Spool
from service.db.schema import gpus, samples
from tests.agent_support import Wire, make_agent, mock_shipper
from tests.support import FakeClock, free_port, live_server


def test_lost_gpu_is_flagged_and_the_others_keep_reporting(
    server: str, http: httpx.Client, engine: Engine, clock: FakeClock, tokens, tmp_path: Path
):
    backend = SimulatedBackend(hostname="node-a", gpus=4, scenarios=["training"] * 4, start=clock())
    agent = make_agent(
        tmp_path, url=server, token=tokens["agent"], clock=clock, backend=backend, wire=Wire()
    )
    for k in range(12):
        if k == 5:
            backend.lose(2)
        agent.run_once()
        clock.advance(10)
    agent.close()
    listed = http.get(
        "/api/v1/gpus", headers={"Authorization": f"Bearer {tokens['reader']}"}
    ).json()
    lost = {g["uuid"]: g["lost"] for g in listed}
    lost_uuid = backend.devices()[2].uuid
    assert lost == {d.uuid: d.uuid == lost_uuid for d in backend.devices()}
    with engine.connect() as conn:
        counts: dict[str, int] = dict(
            conn.execute(
                select(gpus.c.uuid, func.count())
                .join(samples, samples.c.gpu_id == gpus.c.id)
                .group_by(gpus.c.uuid)
            ).all()
        )
    assert counts[lost_uuid] == 5
    assert all(n == 12 for u, n in counts.items() if u != lost_uuid)


def test_full_spool_drops_the_oldest_counts_them_and_replays_the_rest(
    app: FastAPI, engine: Engine, clock: FakeClock, tokens, tmp_path: Path
):
    port = free_port()
    backend = SimulatedBackend(hostname="node-a", gpus=2, start=clock())
    probe = SimulatedBackend(hostname="node-a", gpus=2, start=clock())
    one = len(
        encode(
            {
                "node": {"hostname": "node-a", "labels": {"rack": "r1"}},
                "gpus": [],
                "samples": [],
                "processes": [],
                "x": [r.metrics for r in probe.sample(clock()).readings] * 2,
            }
        )
    )
    agent = make_agent(
        tmp_path,
        url=f"http://127.0.0.1:{port}",
        token=tokens["agent"],
        clock=clock,
        backend=backend,
        wire=(w := Wire()),
        spool_max_bytes=one * 8,  # room for a handful of batches only
    )
    start = clock()
    for _ in range(30):  # central service down throughout
        agent.run_once()
        clock.advance(10)
    dropped = agent.telemetry.registry.get_sample_value("gpuwarden_agent_dropped_batches_total")
    kept = agent.spool.depth
    assert dropped is not None and dropped > 0
    assert dropped + kept == 30
    assert agent.spool.bytes <= one * 8
    with live_server(app, port=port):
        for _ in range(8):
            agent.run_once()
            clock.advance(10)
    agent.close()
    # Batches queued while waiting out the backoff may push out a few more of the oldest.
    dropped = agent.telemetry.registry.get_sample_value("gpuwarden_agent_dropped_batches_total")
    assert dropped is not None
    assert [b["samples"][0]["ts"] for _, b in w.calls] == sorted(
        b["samples"][0]["ts"] for _, b in w.calls
    )
    with engine.connect() as conn:
        first = conn.execute(select(func.min(samples.c.ts))).scalar_one()
        total = conn.execute(select(func.count()).select_from(samples)).scalar_one()
    # The oldest batches are the ones gone: what survived starts right after them.
    assert first == start + timedelta(seconds=10 * dropped)
    assert total == (38 - dropped) * 2


def test_rejected_batch_goes_to_the_dead_letter_file_without_retries(
    server: str, engine: Engine, clock: FakeClock, tokens, tmp_path: Path
):
    wire = Wire()
    backend = SimulatedBackend(hostname="node-a", gpus=2, start=clock())
    skewed = FakeClock(clock() + timedelta(hours=2))  # the node's clock is two hours ahead
    agent = make_agent(
        tmp_path,
        url=server,
        token=tokens["agent"],
        clock=clock,
        backend=backend,
        wire=wire,
        agent_clock=skewed,
    )
    for _ in range(5):
        agent.run_once()
        clock.advance(10)
        skewed.advance(10)
    agent.close()
    assert [s for s, _ in wire.calls] == [422] * 5  # one request per batch: no retry storm
    assert agent.spool.depth == 0
    lines = (tmp_path / "dead-letter.jsonl").read_text().splitlines()
    assert len(lines) == 5
    entry = json.loads(lines[0])
    assert entry["status"] == 422
    assert "in the future" in entry["message"]
    assert len(entry["batch"]["samples"]) == 2
    assert (
        agent.telemetry.registry.get_sample_value("gpuwarden_agent_dead_letter_batches_total") == 5
    )
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(samples)).scalar_one() == 0


def test_plain_400_is_dead_lettered_once_and_later_batches_still_flow(tmp_path: Path):
    seen: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(len(seen))
        if len(seen) == 1:
            return httpx.Response(400, json={"detail": "bad batch"})
        return httpx.Response(200, json={})

    clock = FakeClock()
    backend = SimulatedBackend(hostname="n", gpus=1, start=clock())
    agent = Agent(
        config=AgentConfig(hostname="n", labels={}, dead_letter_path=tmp_path / "dl.jsonl"),
        backend=backend,
        shipper=mock_shipper(handler),
        spool=Spool(tmp_path / "s.sqlite"),
        clock=clock,
    )
    for _ in range(3):
        agent.run_once()
        clock.advance(10)
    agent.close()
    assert len(seen) == 3
    assert "bad batch" in (tmp_path / "dl.jsonl").read_text()
    assert agent.dead_letters == 1 and agent.spool.depth == 0


def test_one_refused_poll_in_a_batch_is_split_out_and_the_good_ones_are_stored(
    server: str, engine: Engine, clock: FakeClock, tokens, tmp_path: Path
):
    wire = Wire()
    backend = SimulatedBackend(hostname="node-a", gpus=2, start=clock())
    agent = make_agent(
        tmp_path,
        url=server,
        token=tokens["agent"],
        clock=clock,
        backend=backend,
        wire=wire,
        batch_cycles=3,
    )
    for k in range(9):
        skew = timedelta(hours=2) if k == 4 else timedelta(0)  # the node's clock jumps once
        snap = agent.poll(clock() + skew)
        assert snap is not None
        agent.take(snap)
        agent.ship(8.0)
        clock.advance(10)
    agent.close()
    # The batch with the skewed poll is refused whole (422), then sent poll by poll.
    assert [s for s, _ in wire.calls] == [200, 422, 200, 422, 200, 200]
    lines = (tmp_path / "dead-letter.jsonl").read_text().splitlines()
    assert len(lines) == 1 and "in the future" in json.loads(lines[0])["message"]
    with engine.connect() as conn:
        stored = conn.execute(select(func.count()).select_from(samples)).scalar_one()
    assert stored == 8 * 2  # every good poll of both GPUs


def test_refused_credentials_keep_the_polls_until_the_token_is_fixed(
    server: str, engine: Engine, clock: FakeClock, tokens, tmp_path: Path
):
    wire = Wire()
    backend = SimulatedBackend(hostname="node-a", gpus=2, start=clock())
    agent = make_agent(
        tmp_path, url=server, token="gw_wrong", clock=clock, backend=backend, wire=wire
    )
    for _ in range(30):  # five minutes with a wrong token
        agent.run_once()
        clock.advance(10)
    assert {s for s, _ in wire.calls} == {401}
    assert 3 <= len(wire.calls) <= 10  # backed off, not once a cycle
    assert agent.spool.depth == 30 and agent.dead_letters == 0
    agent.shipper.headers["Authorization"] = f"Bearer {tokens['agent']}"  # the operator fixes it
    for _ in range(8):
        agent.run_once()
        clock.advance(10)
    agent.close()
    assert agent.spool.depth == 0
    assert not (tmp_path / "dead-letter.jsonl").exists()
    with engine.connect() as conn:
        stored = conn.execute(select(func.count()).select_from(samples)).scalar_one()
    assert stored == 38 * 2  # nothing lost
