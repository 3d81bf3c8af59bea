# Scenario: a new user installs GPU Warden, an agent ships samples for three GPUs, the Slurm hook
# registers three jobs, and `gpuwarden report cost` shows which job wastes the most first,
# with the team view, the idle GPU under __unallocated__ and the default price table in force.
from __future__ import annotations

import json
from datetime import timedelta

import httpx
from sqlalchemy import Engine

from service.cli.main import main
from service.costs.default_prices import DEFAULT_PRICES
from tests.integration.cost_data import GIB, roll_up
from tests.support import FakeClock, iso


def test_new_user_sees_the_most_wasteful_jobs_first(
    http: httpx.Client, server: str, tokens, engine: Engine, clock: FakeClock, capsys
):
    start = clock() - timedelta(hours=2)
    agent = {"Authorization": f"Bearer {tokens['agent']}"}
    patterns = {  # sm_active, fb_used_bytes per GPU for 2 hours every 10 s
        "GPU-busy": (0.92, 30 * GIB),
        "GPU-parked": (0.0, 12 * GIB),  # a forgotten notebook holding memory
        "GPU-spare": (0.3, 0),  # nobody's job: unallocated
    }
    end = clock()
    # The agent comes up first; the Slurm prolog registers each job as it starts.
    clock.set(start)
    gpu_list = [
        {"uuid": uuid, "index": i, "model": "NVIDIA H100 80GB HBM3"}
        for i, uuid in enumerate(patterns)
    ]
    hello = {"node": {"hostname": "node-a", "labels": {}}, "gpus": gpu_list, "samples": []}
    assert http.post("/api/v1/ingest", json=hello, headers=agent).status_code == 200
    for job_id, user, team, gpu in (
        ("slurm:11", "alice", "vision", "GPU-busy"),
        ("slurm:12", "bob", "nlp", "GPU-parked"),
    ):
        r = http.post(
            "/api/v1/jobs",
            json={
                "id": job_id,
                "user": user,
                "team": team,
                "gpus": [gpu],
                "started_at": iso(start),
            },
            headers=agent,
        )
        assert r.status_code == 201, r.text
    clock.set(end)
    for i, (uuid, (sm, fb)) in enumerate(patterns.items()):
        samples = [
            {"gpu_uuid": uuid, "ts": iso(start + timedelta(seconds=10 * k)),
             "metrics": {"sm_active": sm, "fb_used_bytes": fb, "tensor_active": sm / 2}}
            for k in range(720)
        ]  # fmt: skip
        batch = {
            "node": {"hostname": "node-a", "labels": {}},
            "gpus": [gpu_list[i]],
            "samples": samples,
        }
        assert http.post("/api/v1/ingest", json=batch, headers=agent).status_code == 200
    roll_up(engine)

    # The scenario runs on the test clock, not the wall clock: name the window explicitly.
    window = ["--start", iso(clock() - timedelta(days=1)), "--end", iso(clock())]
    base = ["report", "cost", "--url", server, "--token", tokens["reader"], *window]
    assert main([*base, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    keys = [r["key"] for r in report["rows"]]
    assert keys[0] == "slurm:12"  # 2 GPU-hours fully idle while holding memory
    h100 = next(p.usd_per_gpu_hour for p in DEFAULT_PRICES if p.model_pattern == "*H100*")
    top = report["rows"][0]
    assert top["waste_usd"] == top["idle_usd"] == top["cost_usd"] == h100 * 2 * 3600 / 3600
    assert top["top_cause"] == "idle_held" and "tags" not in top
    assert "__unallocated__" in keys
    assert abs(report["rows"][keys.index("slurm:11")]["efficiency"] - 0.92) < 1e-9

    assert main([*base, "--group-by", "team"]) == 0
    table = capsys.readouterr().out
    assert table.index("nlp") < table.index("vision") < table.index("TOTAL")
