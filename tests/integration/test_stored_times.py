"""Times that are stored (jobs, silences, prices) lie within 1970-2200, as query times do."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support import FakeClock, auth, iso

OUT_OF_RANGE = ["0001-01-01T00:00:00Z", "1969-12-31T23:59:59Z", "2200-01-01T00:00:01Z",
                "9999-12-31T23:59:59Z"]  # fmt: skip


@pytest.mark.parametrize("when", OUT_OF_RANGE)
def test_a_job_started_or_ended_out_of_range_is_a_422_naming_the_field(
    http: httpx.Client, tokens, clock: FakeClock, when: str
) -> None:
    admin = auth(tokens["admin"])
    cases: list[tuple[str, dict[str, Any]]] = [
        ("started_at", {"started_at": when}),
        ("ended_at", {"started_at": iso(clock()), "ended_at": when}),
    ]
    for field, times in cases:
        r = http.post("/api/v1/jobs", json={"id": "j1", "gpus": [], **times}, headers=admin)
        assert r.status_code == 422, (field, r.status_code, r.text)
        assert r.json()["detail"][0]["loc"][-1] == field, r.text
        assert http.get("/api/v1/jobs/j1", headers=admin).status_code == 404  # nothing stored
    r = http.post("/api/v1/jobs", json={"id": "j1", "started_at": iso(clock())}, headers=admin)
    assert r.status_code == 201, r.text
    r = http.patch("/api/v1/jobs/j1", json={"ended_at": when}, headers=admin)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "ended_at", r.text
    job = http.get("/api/v1/jobs/j1", headers=admin)
    assert job.status_code == 200 and job.json()["ended_at"] is None


@pytest.mark.parametrize("when", OUT_OF_RANGE)
def test_a_silence_out_of_range_is_a_422_naming_the_field(
    http: httpx.Client, tokens, clock: FakeClock, when: str
) -> None:
    admin = auth(tokens["admin"])
    base = {"matchers": {"node": "node-a"}, "comment": "maintenance"}
    for field, times in [
        ("starts_at", {"starts_at": when, "ends_at": iso(clock())}),
        ("ends_at", {"ends_at": when}),
    ]:
        r = http.post("/api/v1/silences", json={**base, **times}, headers=admin)
        assert r.status_code == 422, (field, r.status_code, r.text)
        assert r.json()["detail"][0]["loc"][-1] == field, r.text
    assert http.get("/api/v1/silences", headers=admin).json() == []


def test_the_edges_of_the_range_are_accepted(http: httpx.Client, tokens) -> None:
    admin = auth(tokens["admin"])
    job = {"id": "j1", "started_at": "1970-01-01T00:00:00Z", "ended_at": "2200-01-01T00:00:00Z"}
    assert http.post("/api/v1/jobs", json=job, headers=admin).status_code == 201
    r = http.get("/api/v1/jobs/j1", headers=admin)
    assert r.status_code == 200, r.text
    silence = {"matchers": {"node": "n"}, "comment": "c", "starts_at": "1970-01-01T00:00:00Z",
               "ends_at": "2200-01-01T00:00:00Z"}  # fmt: skip
    assert http.post("/api/v1/silences", json=silence, headers=admin).status_code == 201
