"""Job ids cannot be squatted: a conflicting claim is refused, recorded and never attributed.

Node B's agent registers ``slurm:101`` (the next Slurm id) with its own GPU, user and team before
the job starts. When the job really starts on node A, A's prolog is refused (409: central cannot
tell which node is honest), the conflict is recorded on the job, logged as an audit line and
counted, and A's GPU time is not put on B's job by A's process hints either. An admin settles it.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
from sqlalchemy import Engine

from tests.conftest import make_token
from tests.support import FakeClock, auth, iso, make_batch


def conflicts(app: Any, source: str) -> float:
    return float(app.state.ctx.telemetry.job_conflicts.labels(source)._value.get())


def hint(clock: FakeClock, node: str, gpu: str, job: str, user: str) -> dict[str, Any]:
    batch = make_batch(hostname=node, gpu_uuids=(gpu,), start=clock())
    batch["processes"] = [{"gpu_uuid": gpu, "ts": iso(clock()), "pid": 4242, "job_id": job,
                           "user": user}]  # fmt: skip
    return batch


def test_a_squatted_job_id_is_a_recorded_conflict_and_gets_no_other_nodes_time(
    app: Any, http: httpx.Client, tokens, engine: Engine, clock: FakeClock, caplog
) -> None:
    node_a, node_b = tokens["agent"], make_token(engine, "agent", "node-b")
    for token, node, gpu in ((node_a, "node-a", "GPU-a0"), (node_b, "node-b", "GPU-b0")):
        r = http.post("/api/v1/ingest", json=make_batch(hostname=node, gpu_uuids=(gpu,),
                                                        start=clock()), headers=auth(token))  # fmt: skip
        assert r.status_code == 200, r.text
    squat = {"id": "slurm:101", "user": "mallory", "team": "red", "gpus": ["GPU-b0"],
             "started_at": iso(clock())}  # fmt: skip
    assert http.post("/api/v1/jobs", json=squat, headers=auth(node_b)).status_code == 201
    clock.advance(60)
    real = {"id": "slurm:101", "user": "alice", "team": "vision", "gpus": ["GPU-a0"],
            "started_at": iso(clock())}  # fmt: skip
    with caplog.at_level(logging.WARNING):
        r = http.post("/api/v1/jobs", json=real, headers=auth(node_a))
        assert r.status_code == 409, r.text
        assert "user" in r.text and "admin" in r.text  # says who can settle it
        # The real job's processes on node A: not attributed to node B's claim either.
        r = http.post("/api/v1/ingest", json=hint(clock, "node-a", "GPU-a0", "slurm:101", "alice"),
                      headers=auth(node_a))  # fmt: skip
        assert r.status_code == 200, r.text
    job = http.get("/api/v1/jobs/slurm:101", headers=auth(tokens["reader"])).json()
    assert (job["user"], job["team"]) == ("mallory", "red")  # nobody's claim changed it
    assert [g["gpu_uuid"] for g in job["gpus"]] == ["GPU-b0"]  # node A's time is not on it
    assert [(c["node"], c["source"], c["claimed"]) for c in job["conflicts"]] == [
        ("node-a", "api", {"user": "alice", "team": "vision"}),
        ("node-a", "observed", {"user": "alice"}),
    ]
    assert conflicts(app, "api") == 1 and conflicts(app, "observed") == 1
    audit = [r.getMessage() for r in caplog.records if "job ownership conflict" in r.getMessage()]
    assert len(audit) == 2 and all("node-a" in a and "slurm:101" in a for a in audit), audit
    assert "node-b" in audit[0]  # names the node whose claim stands

    # An admin settles it: the job is alice's now, and node A's hints attach as usual.
    r = http.patch("/api/v1/jobs/slurm:101", json={"user": "alice", "team": "vision"},
                   headers=auth(tokens["admin"]))  # fmt: skip
    assert r.status_code == 200, r.text
    clock.advance(10)
    r = http.post("/api/v1/ingest", json=hint(clock, "node-a", "GPU-a0", "slurm:101", "alice"),
                  headers=auth(node_a))  # fmt: skip
    assert r.status_code == 200
    job = http.get("/api/v1/jobs/slurm:101", headers=auth(tokens["reader"])).json()
    assert sorted(g["gpu_uuid"] for g in job["gpus"]) == ["GPU-a0", "GPU-b0"]
    assert conflicts(app, "observed") == 1


def test_nodes_that_agree_join_one_job_without_a_conflict(
    app: Any, http: httpx.Client, tokens, engine: Engine, clock: FakeClock
) -> None:
    node_a, node_b = tokens["agent"], make_token(engine, "agent", "node-b")
    for token, node, gpu in ((node_a, "node-a", "GPU-a0"), (node_b, "node-b", "GPU-b0")):
        batch = make_batch(hostname=node, gpu_uuids=(gpu,), start=clock())
        assert http.post("/api/v1/ingest", json=batch, headers=auth(token)).status_code == 200
    for token, gpu in ((node_b, "GPU-b0"), (node_a, "GPU-a0")):
        body = {"id": "slurm:7", "user": "alice", "team": "vision", "gpus": [gpu],
                "started_at": iso(clock())}  # fmt: skip
        assert http.post("/api/v1/jobs", json=body, headers=auth(token)).status_code in (200, 201)
    # A node that never registered it, reporting the job's own user: joins by its hints.
    node_c = make_token(engine, "agent", "node-c")
    r = http.post("/api/v1/ingest", json=hint(clock, "node-c", "GPU-c0", "slurm:7", "alice"),
                  headers=auth(node_c))  # fmt: skip
    assert r.status_code == 200
    job = http.get("/api/v1/jobs/slurm:7", headers=auth(tokens["reader"])).json()
    assert sorted(g["gpu_uuid"] for g in job["gpus"]) == ["GPU-a0", "GPU-b0", "GPU-c0"]
    assert job["conflicts"] == []
    assert conflicts(app, "api") == 0 and conflicts(app, "observed") == 0
