"""Rights to a job do not travel with a GPU (issue 45, part 4).

node-a's agent registers ``slurm:101`` on GPU-a0. After 60 s of silence node-b's agent reports
GPU-a0 (the documented move) and the GPU is node-b's now. Each interval keeps the node that
registered it: node-b may not end, change or re-register node-a's job through the GPU (403,
saying why), while node-a still ends its own part although the GPU has left it.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, insert, select

from service.db.migrate import upgrade
from service.db.schema import gpus, job_gpus, jobs, nodes
from tests.conftest import empty_engine, make_token
from tests.support import FakeClock, auth, iso, make_batch


def ingest(http: httpx.Client, token: str, node: str, clock: FakeClock, *uuids: str) -> None:
    batch = make_batch(hostname=node, gpu_uuids=uuids, start=clock())
    r = http.post("/api/v1/ingest", json=batch, headers=auth(token))
    assert r.status_code == 200, r.text


def moved_job(http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock) -> str:
    """node-a registers slurm:101 on GPU-a0, then GPU-a0 moves to node-b; node-b's token."""
    ingest(http, tokens["agent"], "node-a", clock, "GPU-a0")
    body = {"id": "slurm:101", "user": "alice", "gpus": ["GPU-a0"], "started_at": iso(clock())}
    assert http.post("/api/v1/jobs", json=body, headers=auth(tokens["agent"])).status_code == 201
    clock.advance(600)  # node-a fell silent; node-b reports the GPU and it moves there
    node_b = make_token(engine, "agent", "node-b")
    ingest(http, node_b, "node-b", clock, "GPU-b0", "GPU-a0")
    return node_b


def job(http: httpx.Client, tokens: dict[str, str]) -> dict[str, Any]:
    r = http.get("/api/v1/jobs/slurm:101", headers=auth(tokens["reader"]))
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_a_moved_gpus_new_node_may_not_end_change_or_reregister_the_old_nodes_job(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock
) -> None:
    node_b = moved_job(http, tokens, engine, clock)
    (iv,) = job(http, tokens)["gpus"]
    assert (iv["node"], iv["registered_node"]) == ("node-b", "node-a")

    end = {"ended_at": iso(clock())}
    r = http.patch("/api/v1/jobs/slurm:101", json=end, headers=auth(node_b))
    assert r.status_code == 403, r.text
    detail = r.json()["detail"]
    assert "ended_at" in detail and "moved to node 'node-b'" in detail and "node-a" in detail
    r = http.patch("/api/v1/jobs/slurm:101", json={"team": "red"}, headers=auth(node_b))
    assert r.status_code == 403 and "registered the job" in r.text, r.text
    again = {"id": "slurm:101", "gpus": ["GPU-a0"], "started_at": iso(clock()),
             "ended_at": iso(clock() + timedelta(seconds=1))}  # fmt: skip
    r = http.post("/api/v1/jobs", json=again, headers=auth(node_b))
    assert r.status_code == 403 and "gpus.0" in r.text and "node-a" in r.text, r.text

    after = job(http, tokens)
    assert after["ended_at"] is None and after["team"] is None
    assert [g["ended_at"] for g in after["gpus"]] == [None]


def test_an_exclusive_job_on_the_moved_gpu_does_not_end_the_old_nodes_job(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock
) -> None:
    """An exclusive registration ends earlier jobs still open on its GPUs (missed epilogs), but
    only those of its own node: node-b cannot end node-a's job by registering one on GPU-a0."""
    node_b = moved_job(http, tokens, engine, clock)
    body = {"id": "slurm:202", "user": "bob", "gpus": ["GPU-a0"], "started_at": iso(clock()),
            "exclusive": True}  # fmt: skip
    r = http.post("/api/v1/jobs", json=body, headers=auth(node_b))
    assert r.status_code == 201, r.text
    after = job(http, tokens)
    assert after["ended_at"] is None and [g["ended_at"] for g in after["gpus"]] == [None]
    # node-b's own earlier job on the GPU is still ended by its next exclusive job.
    clock.advance(60)
    body = {"id": "slurm:203", "user": "bob", "gpus": ["GPU-a0"], "started_at": iso(clock()),
            "exclusive": True}  # fmt: skip
    assert http.post("/api/v1/jobs", json=body, headers=auth(node_b)).status_code == 201
    r = http.get("/api/v1/jobs/slurm:202", headers=auth(tokens["reader"]))
    assert r.json()["ended_at"] is not None
    assert job(http, tokens)["ended_at"] is None


def test_the_registering_node_still_ends_its_part_after_the_gpu_moved_away(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock
) -> None:
    moved_job(http, tokens, engine, clock)
    ended = iso(clock())
    r = http.patch(
        "/api/v1/jobs/slurm:101", json={"ended_at": ended}, headers=auth(tokens["agent"])
    )
    assert r.status_code == 200, r.text
    after = job(http, tokens)
    assert after["ended_at"] is not None
    assert [(g["registered_node"], g["ended_at"] is not None) for g in after["gpus"]] == [
        ("node-a", True)
    ]


def test_a_third_node_is_told_it_registered_nothing_of_the_job(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock
) -> None:
    moved_job(http, tokens, engine, clock)
    node_c = make_token(engine, "agent", "node-c")
    r = http.patch("/api/v1/jobs/slurm:101", json={"ended_at": iso(clock())}, headers=auth(node_c))
    assert r.status_code == 403 and "node 'node-c' registered no GPU" in r.text, r.text
    r = http.patch("/api/v1/jobs/slurm:101", json={"ended_at": iso(clock())},
                   headers=auth(tokens["admin"]))  # fmt: skip
    assert r.status_code == 200 and job(http, tokens)["ended_at"] is not None


def test_a_moved_gpus_new_node_joins_a_job_only_with_hints_of_the_jobs_own_user(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock
) -> None:
    """node-b's process hints naming node-a's job with another user are a recorded conflict:
    holding the job's GPU now does not make node-b one of the job's nodes."""
    node_b = moved_job(http, tokens, engine, clock)
    clock.advance(10)
    batch = make_batch(hostname="node-b", gpu_uuids=("GPU-a0",), start=clock())
    batch["processes"] = [{"gpu_uuid": "GPU-a0", "ts": iso(clock()), "pid": 7,
                           "job_id": "slurm:101", "user": "mallory"}]  # fmt: skip
    assert http.post("/api/v1/ingest", json=batch, headers=auth(node_b)).status_code == 200
    conflicts = job(http, tokens)["conflicts"]
    assert [(c["node"], c["source"]) for c in conflicts] == [("node-b", "observed")]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migration_0029_gives_stored_intervals_their_gpus_node(
    backend: str, tmp_path: Path, clock: FakeClock
) -> None:
    with empty_engine(backend, tmp_path) as engine:
        upgrade(engine, "0027")
        t = clock()
        with engine.begin() as conn:
            conn.execute(insert(nodes).values(id=1, hostname="node-a", labels={},
                                              first_seen_at=t, last_seen_at=t))  # fmt: skip
            conn.execute(insert(gpus).values(id=1, uuid="GPU-a0", node_id=1, gpu_index=0,
                                             model="H100", first_seen_at=t))  # fmt: skip
            conn.execute(insert(jobs).values(id="j", labels={}, source="api", started_at=t,
                                             created_at=t, updated_at=t))  # fmt: skip
            conn.execute(insert(job_gpus).values(job_id="j", gpu_id=1, started_at=t,
                                                 source="api"))  # fmt: skip
        upgrade(engine)
        with engine.connect() as conn:
            assert conn.execute(select(job_gpus.c.registered_node)).scalars().all() == ["node-a"]
