"""The first cost report explains itself: fresh GPUs, rollups catching up, default prices."""

from __future__ import annotations

from datetime import timedelta

import httpx

from service.usecases.upkeep import rollup_once
from tests.support import FakeClock, auth, iso, make_batch


def report(http: httpx.Client, token: str, **params: str) -> dict:  # type: ignore[type-arg]
    r = http.get("/api/v1/reports/cost", params=params, headers=auth(token))
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_an_empty_fleet_says_no_gpu_has_reported(http, tokens):
    data = report(http, tokens["reader"])
    assert data["rows"] == []
    assert any("no GPU has reported yet" in w for w in data["warnings"])


def test_a_gpu_first_seen_seconds_ago_is_not_held_all_week(app, http, tokens, clock: FakeClock):
    start = clock() - timedelta(seconds=20)
    batch = make_batch(start=start, count=3, gpu_uuids=("GPU-a0", "GPU-a1"))
    http.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"])).raise_for_status()
    before = report(http, tokens["reader"])  # rollups have not run yet: read from raw samples
    assert not any("not rolled up yet" in w for w in before["warnings"])
    assert before["totals"]["allocated_seconds"] > 2 * 15
    rollup_once(app.state.ctx)
    clock.advance(5)
    data = report(http, tokens["reader"])
    assert not any("not rolled up yet" in w for w in data["warnings"])
    # two GPUs known for ~25 s: about 50 GPU-seconds, not 2 x 7 days
    assert data["totals"]["held_seconds"] < 2 * 90
    assert data["totals"]["allocated_seconds"] > 0
    # the totals and the rows measure no-data the same way
    rows = data["rows"]
    assert sum(r["nodata_seconds"] for r in rows) == data["totals"]["nodata_seconds"]
    assert sum(r["held_seconds"] for r in rows) == data["totals"]["held_seconds"]


def test_group_by_node_has_no_unallocated_node_and_default_prices_are_marked(
    app, http, tokens, clock: FakeClock
):
    start = clock() - timedelta(minutes=10)
    batch = make_batch(start=start, count=60, gpu_uuids=("GPU-a0", "GPU-a1"))
    http.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"])).raise_for_status()
    job = {"id": "slurm:7", "user": "alice", "gpus": ["GPU-a0"], "started_at": iso(start)}
    http.post("/api/v1/jobs", json=job, headers=auth(tokens["admin"])).raise_for_status()
    rollup_once(app.state.ctx)
    by_node = report(http, tokens["reader"], group_by="node", since="1h")
    assert [r["key"] for r in by_node["rows"]] == ["node-a"]
    assert by_node["rows"][0]["gpus"] == 2  # the job's GPU and the idle one, both the node's
    by_job = report(http, tokens["reader"], since="1h")
    assert {r["key"] for r in by_job["rows"]} == {"slurm:7", "__unallocated__"}
    assert by_node["totals"]["cost_usd"] == by_job["totals"]["cost_usd"]
    assert by_job["price_source"] == "default"
    assert any("shipped defaults" in w for w in by_job["warnings"])
    by_gpu = report(http, tokens["reader"], group_by="gpu", since="1h")
    assert sorted(r["key"] for r in by_gpu["rows"]) == ["GPU-a0", "GPU-a1"]


def test_a_gpu_is_held_from_its_first_sample_not_the_minute_before(
    app, http, tokens, clock: FakeClock
):
    # `make up` 90 s in: the first sample came 50 s into a minute. Held time starts there, so
    # the report shows no phantom "no data" for the seconds before it (issue 50).
    first = clock() - timedelta(seconds=90)
    assert first.second != 0
    batch = make_batch(start=first, count=9, gpu_uuids=("GPU-a0",))  # every 10 s to +80 s
    http.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"])).raise_for_status()
    for rolled in (False, True):
        if rolled:
            rollup_once(app.state.ctx)
        totals = report(http, tokens["reader"], since="1h")["totals"]
        assert totals["held_seconds"] == 90.0, rolled
        assert totals["nodata_seconds"] == 0.0, rolled
        assert totals["nodata_usd"] == 0.0, rolled
