"""A job's progress counter (issue 46): stored under the monotonic rule, refused with the field
named, read back with its summary; on both stores, through the real app on loopback."""

from __future__ import annotations

from datetime import timedelta

import httpx
from sqlalchemy import Engine

from service.cli.fleet import job_report
from service.usecases.upkeep import rollup_once
from tests.alerting_support import add_job, ingest
from tests.conftest import make_token
from tests.support import FakeClock, auth, iso

URL = "/api/v1/jobs/{}/progress"


def _job(http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock) -> None:
    start = clock() - timedelta(minutes=10)
    ingest(http, tokens["agent"], start=start, count=6, metrics={"sm_active": 0.9})
    add_job(engine, "slurm:77", ("GPU-a0",), started_at=start)


def test_readings_stored_and_summarised(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock
) -> None:
    _job(http, tokens, engine, clock)
    t0 = clock()
    for i, value in enumerate((100.0, 160.0, 160.0, 400.0)):
        body = {"unit": "steps", "value": value, "at": iso(t0 + timedelta(seconds=60 * i))}
        r = http.post(URL.format("slurm:77"), json=body, headers=auth(tokens["agent"]))
        assert r.status_code == 201, r.text
        assert r.json()["stored"] is True
    # The last reading sent again (a retry) is accepted once, not stored twice.
    r = http.post(URL.format("slurm:77"), json=body, headers=auth(tokens["agent"]))
    assert r.status_code == 200 and r.json()["stored"] is False
    r = http.get(URL.format("slurm:77"), headers=auth(tokens["reader"]))
    assert r.status_code == 200, r.text
    got = r.json()
    assert [x["value"] for x in got["readings"]] == [100.0, 160.0, 160.0, 400.0]
    summary = got["summary"]
    assert summary["unit"] == "steps"
    assert summary["first_value"] == 100.0 and summary["last_value"] == 400.0
    assert summary["units_advanced"] == 300.0
    assert summary["rate_per_second"] == 300.0 / 180.0
    assert summary["last_advanced_at"] == iso(t0 + timedelta(seconds=180))
    assert summary["readings"] == 4


def test_default_time_is_now_and_no_readings_is_null(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock
) -> None:
    _job(http, tokens, engine, clock)
    r = http.get(URL.format("slurm:77"), headers=auth(tokens["reader"]))
    assert r.json() == {"job_id": "slurm:77", "readings": [], "summary": None}
    r = http.post(
        URL.format("slurm:77"), json={"unit": "tokens", "value": 5e9}, headers=auth(tokens["admin"])
    )
    assert r.status_code == 201, r.text
    assert r.json()["at"] == iso(clock())


def _refusal(http: httpx.Client, token: str, body: dict[str, object]) -> tuple[int, str]:
    r = http.post(URL.format("slurm:77"), json=body, headers=auth(token))
    return r.status_code, str(r.json().get("detail"))


def test_bad_readings_refused_naming_the_field(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock
) -> None:
    _job(http, tokens, engine, clock)
    agent = tokens["agent"]
    now = clock()
    status, detail = _refusal(http, agent, {"unit": "epochs", "value": 1})
    assert status == 422 and "unit" in detail
    status, detail = _refusal(http, agent, {"unit": "steps", "value": -1})
    assert status == 422 and "value" in detail
    r = http.post(
        URL.format("slurm:77"),
        content=b'{"unit": "steps", "value": Infinity}',
        headers={**auth(agent), "Content-Type": "application/json"},
    )
    assert r.status_code == 422 and "value" in r.text
    status, detail = _refusal(http, agent, {"unit": "steps", "value": 1, "extra": 2})
    assert status == 422 and "extra" in detail
    status, detail = _refusal(
        http, agent, {"unit": "steps", "value": 1, "at": iso(now + timedelta(hours=1))}
    )
    assert status == 422 and "at" in detail
    assert _refusal(http, agent, {"unit": "steps", "value": 50, "at": iso(now)})[0] == 201
    # Below the last total: not monotonic.
    status, detail = _refusal(
        http, agent, {"unit": "steps", "value": 49, "at": iso(now + timedelta(seconds=1))}
    )
    assert status == 409 and detail.startswith("value:") and "monotonic" in detail
    # Another unit mid-job.
    status, detail = _refusal(
        http, agent, {"unit": "samples", "value": 60, "at": iso(now + timedelta(seconds=1))}
    )
    assert status == 409 and detail.startswith("unit:")
    # Older than the last reading.
    status, detail = _refusal(
        http, agent, {"unit": "steps", "value": 60, "at": iso(now - timedelta(seconds=1))}
    )
    assert status == 409 and detail.startswith("at:")
    # Nothing refused was stored.
    r = http.get(URL.format("slurm:77"), headers=auth(tokens["reader"]))
    assert [x["value"] for x in r.json()["readings"]] == [50.0]


def test_who_may_report(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock
) -> None:
    _job(http, tokens, engine, clock)
    body = {"unit": "steps", "value": 1}
    other_node = make_token(engine, "agent", "node-b")
    status, detail = _refusal(http, other_node, body)
    assert status == 403 and detail.startswith("progress:")
    assert _refusal(http, tokens["reader"], body)[0] == 403
    r = http.post(URL.format("slurm:77"), json=body)
    assert r.status_code == 401
    r = http.post(URL.format("slurm:78"), json=body, headers=auth(tokens["admin"]))
    assert r.status_code == 404
    r = http.get(URL.format("slurm:78"), headers=auth(tokens["reader"]))
    assert r.status_code == 404
    assert _refusal(http, tokens["agent"], body)[0] == 201


def test_kubernetes_id_with_a_slash(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock
) -> None:
    start = clock() - timedelta(minutes=10)
    ingest(http, tokens["agent"], start=start, count=6, metrics={"sm_active": 0.9})
    add_job(engine, "k8s:ml/train-0", ("GPU-a0",), started_at=start)
    r = http.post(
        URL.format("k8s:ml/train-0"),
        json={"unit": "samples", "value": 64},
        headers=auth(tokens["agent"]),
    )
    assert r.status_code == 201, r.text
    r = http.get(URL.format("k8s:ml/train-0"), headers=auth(tokens["reader"]))
    assert r.json()["summary"]["last_value"] == 64.0
    # The job's own page is still its page.
    r = http.get("/api/v1/jobs/k8s:ml/train-0", headers=auth(tokens["reader"]))
    assert r.status_code == 200 and r.json()["id"] == "k8s:ml/train-0"


def test_job_page_counts_gpu_seconds_per_unit(
    app, http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock
) -> None:
    _job(http, tokens, engine, clock)
    rollup_once(app.state.ctx)
    page = http.get("/api/v1/jobs/slurm:77", headers=auth(tokens["reader"])).json()
    held = page["summary"]["held_seconds"]
    assert held > 0
    # No progress: the unit is the whole run, said so.
    assert page["progress"] is None and page["gpu_seconds_per_unit"] is None
    assert page["unit_of_work"] == "run" and "whole run" in page["unit_of_work_text"]
    assert "Unit of work: the job reported no progress" in job_report(page, now=clock())
    t0 = clock() - timedelta(minutes=5)
    for i, value in enumerate((0, 1200)):
        body = {"unit": "tokens", "value": value, "at": iso(t0 + timedelta(minutes=5 * i))}
        r = http.post(URL.format("slurm:77"), json=body, headers=auth(tokens["agent"]))
        assert r.status_code == 201, r.text
    page = http.get("/api/v1/jobs/slurm:77", headers=auth(tokens["reader"])).json()
    assert page["progress"]["units_advanced"] == 1200.0
    assert page["unit_of_work"] == "token"
    assert page["gpu_seconds_per_unit"] == held / 1200.0
    assert "GPU-seconds per token" in page["unit_of_work_text"]
    text = job_report(page, now=clock())
    assert "Progress: 1,200 tokens (from 0: 1,200 advanced, 4/s); last advanced " in text
    assert f"Unit of work: {page['unit_of_work_text']}" in text


def test_a_pod_named_progress_still_has_its_page(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock
) -> None:
    start = clock() - timedelta(minutes=10)
    ingest(http, tokens["agent"], start=start, count=6, metrics={"sm_active": 0.9})
    add_job(engine, "k8s:ml/progress", ("GPU-a0",), started_at=start)
    r = http.get("/api/v1/jobs/k8s:ml/progress", headers=auth(tokens["reader"]))
    assert r.status_code == 200, r.text
    assert r.json()["id"] == "k8s:ml/progress" and r.json()["unit_of_work"] == "run"
    r = http.post(
        "/api/v1/jobs/k8s:ml/progress/progress",
        json={"unit": "steps", "value": 3},
        headers=auth(tokens["agent"]),
    )
    assert r.status_code == 201, r.text
    r = http.get("/api/v1/jobs/k8s:ml/progress/progress", headers=auth(tokens["reader"]))
    assert r.json()["summary"]["last_value"] == 3.0
    # Its node's agent still ends it, and a field it may not send is still named.
    r = http.patch("/api/v1/jobs/k8s:ml/progress", json={"bogus": 1}, headers=auth(tokens["agent"]))
    assert r.status_code == 422 and "bogus" in r.text
    r = http.patch(
        "/api/v1/jobs/k8s:ml/progress",
        json={"ended_at": iso(clock())},
        headers=auth(tokens["agent"]),
    )
    assert r.status_code == 200, r.text
    assert r.json()["id"] == "k8s:ml/progress" and r.json()["ended_at"] == iso(clock())
    # A method /progress does not take: 405, naming the ones it does.
    for method in ("PATCH", "PUT", "DELETE"):
        r = http.request(
            method, "/api/v1/jobs/k8s:ml/train/progress", headers=auth(tokens["admin"])
        )
        assert r.status_code == 405 and r.headers["allow"] == "GET, POST", (method, r.text)
