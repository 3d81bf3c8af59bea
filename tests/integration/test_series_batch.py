"""One read for a job's charts: several metrics of several GPUs, the same figures as one series each."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest

from service.usecases.upkeep import rollup_once
from tests.alerting_support import auth
from tests.support import FakeClock, iso, make_batch, query_field

# A job id (under a prefix of no scheduler GPU Warden drives, so not held to one's
# spelling) with the characters that end a path segment, a query or a fragment.
JOB = "ray:ml team/train-7f9c|run?1#a%b ü"
METRICS = ["activity", "sm_active", "fb_used_bytes"]


@pytest.fixture
def two_gpus(app: Any, http: httpx.Client, tokens: dict[str, str], clock: FakeClock) -> Any:
    """GPU-a0 busy and GPU-a1 idle for 30 min, both under job JOB; rolled up."""
    start = (clock() - timedelta(hours=1)).replace(second=0, microsecond=0)
    for uuid, sm, fb in (("GPU-a0", 0.75, 40 * 2**30), ("GPU-a1", 0.0, 2**30)):
        batch = make_batch(gpu_uuids=(uuid,), start=start, count=180,
                           metrics={"sm_active": sm, "fb_used_bytes": fb})  # fmt: skip
        batch["gpus"][0]["index"] = int(uuid[-1])
        r = http.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"]))
        assert r.status_code == 200, r.text
    job = {"id": JOB, "gpus": ["GPU-a0", "GPU-a1"], "started_at": iso(start),
           "ended_at": iso(start + timedelta(minutes=30))}  # fmt: skip
    r = http.post("/api/v1/jobs", json=job, headers=auth(tokens["admin"]))
    assert r.status_code == 201, r.text
    rollup_once(app.state.ctx)
    return start


@pytest.mark.parametrize("step", ["10s", "5m"])
def test_a_jobs_series_in_one_read_match_the_one_series_reads(
    http: httpx.Client, tokens: dict[str, str], two_gpus: Any, step: str
) -> None:
    h = auth(tokens["reader"])
    r = http.get("/api/v1/gpus/series", params={"job": JOB, "metric": METRICS, "step": step},
                 headers=h)  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["job"] == JOB
    # The job's own window when none is given.
    assert body["start"] == iso(two_gpus) and body["end"] == iso(two_gpus + timedelta(minutes=30))
    assert body["resolution"] == ("raw" if step == "10s" else "1m")
    got = [(s["gpu_uuid"], s["node"], s["metric"]) for s in body["series"]]
    assert got == [(u, "node-a", m) for u in ("GPU-a0", "GPU-a1") for m in METRICS]
    for line in body["series"]:
        one = http.get(
            f"/api/v1/gpus/{line['gpu_uuid']}/series",
            params={"metric": line["metric"], "start": body["start"], "end": body["end"],
                    "step": step},
            headers=h,
        ).json()  # fmt: skip
        assert line["unit"] == one["unit"] and line["points"] == one["points"]
        assert line["points"], line
    busy = {s["metric"]: s["points"][0]["avg"] for s in body["series"] if s["gpu_uuid"] == "GPU-a0"}
    idle = {s["metric"]: s["points"][0]["avg"] for s in body["series"] if s["gpu_uuid"] == "GPU-a1"}
    assert busy["sm_active"] == pytest.approx(0.75) and idle["sm_active"] == 0.0
    assert busy["fb_used_bytes"] == 40 * 2**30 and idle["fb_used_bytes"] == 2**30


def test_named_gpus_and_a_window_are_read_as_asked(
    http: httpx.Client, tokens: dict[str, str], two_gpus: Any
) -> None:
    start, end = iso(two_gpus + timedelta(minutes=10)), iso(two_gpus + timedelta(minutes=20))
    r = http.get(
        "/api/v1/gpus/series",
        params={"gpu": ["GPU-a1", "GPU-a0"], "metric": "sm_active", "start": start, "end": end,
                "step": "60"},
        headers=auth(tokens["reader"]),
    )  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["job"] is None and body["start"] == start and body["end"] == end
    assert [s["gpu_uuid"] for s in body["series"]] == ["GPU-a1", "GPU-a0"]
    assert [len(s["points"]) for s in body["series"]] == [10, 10]


def test_batch_series_errors_name_the_parameter(
    http: httpx.Client, tokens: dict[str, str], two_gpus: Any
) -> None:
    h = auth(tokens["reader"])
    get = lambda **params: http.get("/api/v1/gpus/series", params=params, headers=h)  # noqa: E731
    assert query_field(get(job=JOB, metric=["sm_active", "sm_busy"])) == "metric"
    assert query_field(get(metric="sm_active")) == "job"
    assert query_field(get(job=JOB, gpu="GPU-a0", metric="sm_active")) == "gpu"
    assert query_field(get(job=JOB, metrics="sm_active", metric="sm_active")) == "metrics"
    assert query_field(get(job=JOB, metric="sm_active", step="1s", start="-7d")) == "step"
    assert query_field(get(job=JOB, metric="sm_active", start="yesterday")) == "start"
    r = get(job=JOB + "x", metric="sm_active")
    assert r.status_code == 404 and JOB + "x" in r.json()["detail"]
    r = get(gpu="GPU-zz", metric="sm_active")
    assert r.status_code == 404 and "GPU-zz" in r.json()["detail"]
    assert get(job=JOB, metric="sm_active").status_code == 200
    assert (
        http.get("/api/v1/gpus/series", params={"job": JOB, "metric": "sm_active"}).status_code
        == 401
    )


def test_the_batch_read_is_declared_in_the_openapi_document(app: Any) -> None:
    op = app.openapi()["paths"]["/api/v1/gpus/series"]["get"]
    params = {p["name"]: p for p in op["parameters"]}
    assert set(params) == {"metric", "job", "gpu", "start", "end", "step"}
    assert params["metric"]["required"] and params["metric"]["schema"]["type"] == "array"
    assert {"200", "404", "422", "503"} <= set(op["responses"])
    ref = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    assert ref.endswith("/SeriesBatchPublic")
