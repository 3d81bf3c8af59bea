"""A GPU seen from another node than its own: it moves there once its old node no longer reports
it (logged, counted, in its history), and a GPU two nodes still report is left out of the batch
alone, with a reason, never blocking the batch's other GPUs."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, func, select

from service.collectors.simulated import SimulatedBackend
from service.db.schema import samples
from tests.agent_support import Wire, make_agent
from tests.alerting_support import auth
from tests.conftest import make_token
from tests.support import FakeClock, make_batch


def stored(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(samples)).scalar_one())


def metric(http: httpx.Client, name: str) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not on /metrics")


def test_a_gpu_seen_from_a_new_node_moves_there_with_its_other_gpus_stored(
    http: httpx.Client, tokens, engine: Engine, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    node_a = auth(tokens["agent"])
    first = make_batch(hostname="node-a", gpu_uuids=("GPU-a0",), start=clock())
    assert http.post("/api/v1/ingest", json=first, headers=node_a).status_code == 200
    # The GPU is taken out of node-a and put into node-b: node-a stops reporting it.
    clock.advance(600)
    node_b = auth(make_token(engine, "agent", "node-b"))
    batch = make_batch(hostname="node-b", gpu_uuids=("GPU-b0", "GPU-a0"), start=clock(), count=2)
    with caplog.at_level(logging.WARNING, logger="service.usecases.ingest"):
        r = http.post("/api/v1/ingest", json=batch, headers=node_b)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["samples_stored"] == 4 and stored(engine) == 5
    (claim,) = body["gpu_claims"]
    assert claim["gpu_uuid"] == "GPU-a0" and claim["from_node"] == "node-a" and claim["moved"]
    assert "moved from node 'node-a' to 'node-b'" in claim["reason"]
    assert any("GPU-a0 moved from node 'node-a'" in m for m in caplog.messages)

    reader = auth(tokens["reader"])
    nodes = {g["uuid"]: g["node"] for g in http.get("/api/v1/gpus", headers=reader).json()}
    assert nodes == {"GPU-a0": "node-b", "GPU-b0": "node-b"}
    (move,) = http.get("/api/v1/gpus/GPU-a0/moves", headers=reader).json()
    assert (move["from_node"], move["to_node"]) == ("node-a", "node-b")
    assert move["moved_at"].startswith(clock().date().isoformat())
    assert move["from_last_sample_at"] is not None
    assert http.get("/api/v1/gpus/GPU-b0/moves", headers=reader).json() == []
    assert http.get("/api/v1/gpus/GPU-zz/moves", headers=reader).status_code == 404
    assert metric(http, "gpuwarden_gpu_moves_total") == 1

    # It is node-b's now: node-b's next batch stores without a claim; node-a's is the one left out.
    clock.advance(10)
    again = make_batch(hostname="node-b", gpu_uuids=("GPU-a0",), start=clock())
    r = http.post("/api/v1/ingest", json=again, headers=node_b)
    assert r.status_code == 200 and r.json()["gpu_claims"] == []
    late = make_batch(hostname="node-a", gpu_uuids=("GPU-a0",), start=clock())
    r = http.post("/api/v1/ingest", json=late, headers=node_a)
    assert r.status_code == 200 and not r.json()["gpu_claims"][0]["moved"]


def test_a_gpu_two_nodes_still_report_is_left_out_alone_and_says_why(
    http: httpx.Client, tokens, engine: Engine, clock: FakeClock
) -> None:
    node_a = auth(tokens["agent"])
    first = make_batch(hostname="node-a", gpu_uuids=("GPU-a0",), start=clock())
    assert http.post("/api/v1/ingest", json=first, headers=node_a).status_code == 200
    # node-b's agent reads node-a's exporter too (a Service without internalTrafficPolicy).
    clock.advance(10)
    node_b = auth(make_token(engine, "agent", "node-b"))
    batch = make_batch(hostname="node-b", gpu_uuids=("GPU-b0", "GPU-a0"), start=clock())
    r = http.post("/api/v1/ingest", json=batch, headers=node_b)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["samples_stored"] == 1 and stored(engine) == 2  # GPU-b0's sample, not GPU-a0's
    (claim,) = body["gpu_claims"]
    assert claim["gpu_uuid"] == "GPU-a0" and not claim["moved"]
    assert "still reported by node 'node-a'" in claim["reason"]
    assert "internalTrafficPolicy: Local" in claim["reason"]
    reader = auth(tokens["reader"])
    nodes = {g["uuid"]: g["node"] for g in http.get("/api/v1/gpus", headers=reader).json()}
    assert nodes == {"GPU-a0": "node-a", "GPU-b0": "node-b"}
    assert http.get("/api/v1/gpus/GPU-a0/moves", headers=reader).json() == []
    assert metric(http, "gpuwarden_ingest_gpus_refused_total") == 1
    assert metric(http, "gpuwarden_gpu_moves_total") == 0


def test_an_agent_reading_another_nodes_gpus_is_told_why_and_keeps_nothing_back(
    server: str, engine: Engine, clock: FakeClock, tokens, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """node-b's agent reads node-a's GPUs (say, node-a's exporter through a Service) beside
    its own: its batches are stored without them, its log says so, and its spool drains."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    mine = SimulatedBackend(hostname="node-a", gpus=1, start=clock())
    agent_a = make_agent(tmp_path / "a", url=server, token=tokens["agent"], clock=clock,
                         backend=mine, wire=Wire())  # fmt: skip
    agent_a.run_once()
    theirs = SimulatedBackend(hostname="node-a", gpus=1, start=clock())
    agent_b = make_agent(tmp_path / "b", url=server, token=make_token(engine, "agent", "node-b"),
                         clock=clock, backend=theirs, wire=Wire(), hostname="node-b")  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="service.collectors.agent"):
        for _ in range(3):
            clock.advance(10)
            agent_a.run_once()
            agent_b.run_once()
    agent_a.close()
    assert agent_b.spool.depth == 0
    agent_b.close()
    said = [m for m in caplog.messages if "without one GPU" in m]
    assert len(said) == 1  # once a minute, not every batch
    assert "still reported by node 'node-a'" in said[0]
    assert not [m for m in caplog.messages if "check the agent token" in m]


def test_a_gpu_refused_batch_after_batch_is_logged_once_an_hour_and_counted_each_time(
    http: httpx.Client, tokens, engine: Engine, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    node_a = auth(tokens["agent"])
    node_b = auth(make_token(engine, "agent", "node-b"))

    def both_report(gpus_b: tuple[str, ...], after: float = 60) -> None:
        clock.advance(after)
        own = make_batch(hostname="node-a", gpu_uuids=("GPU-a0", "GPU-a1"), start=clock())
        assert http.post("/api/v1/ingest", json=own, headers=node_a).status_code == 200
        seen = make_batch(hostname="node-b", gpu_uuids=gpus_b, start=clock())
        r = http.post("/api/v1/ingest", json=seen, headers=node_b)
        assert r.status_code == 200 and all(not c["moved"] for c in r.json()["gpu_claims"])

    with caplog.at_level(logging.INFO, logger="service.usecases.ingest"):
        for _ in range(3):  # node-b's agent reads node-a's exporter: every batch repeats it
            both_report(("GPU-b0", "GPU-a0"))
        both_report(("GPU-b0", "GPU-a0", "GPU-a1"))
        said = [m for m in caplog.messages if "still reported by node 'node-a'" in m]
        assert [m.split(" ")[1] for m in said] == ["GPU-a0", "GPU-a1"], said
        assert metric(http, "gpuwarden_ingest_gpus_refused_total") == 5
        both_report(("GPU-b0", "GPU-a0"), after=3419)  # 59 min 59 s after it was said
        assert len([m for m in caplog.messages if "still reported by" in m]) == 2
        both_report(("GPU-b0", "GPU-a0"), after=1)  # an hour after: said again
    said = [m for m in caplog.messages if "still reported by node 'node-a'" in m]
    assert [m.split(" ")[1] for m in said] == ["GPU-a0", "GPU-a1", "GPU-a0"], said
    assert "once an hour" in said[0]
    assert metric(http, "gpuwarden_ingest_gpus_refused_total") == 7
