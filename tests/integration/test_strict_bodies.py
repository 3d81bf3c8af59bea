"""Request bodies take times as RFC 3339 text and flags as JSON booleans, nothing coerced.

Found by schemathesis's negative_data_rejection: `"started_at": 0` was read as 1970 and
`"retired": 0` as false. Real service on loopback, both stores.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest

from tests.alerting_support import auth
from tests.support import FakeClock, iso, make_batch


@pytest.mark.parametrize("value", [0, 1_700_000_000, 1.5, True])
def test_a_time_in_a_body_must_be_text(
    http: httpx.Client, tokens: dict[str, str], clock: FakeClock, value: Any
) -> None:
    admin = auth(tokens["admin"])
    batch = make_batch(start=clock() - timedelta(seconds=30))
    assert http.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"])).is_success
    ends = iso(clock() + timedelta(hours=1))
    cases: list[tuple[str, str, Any, str]] = [
        ("POST", "/api/v1/jobs", {"id": "j1", "gpus": ["GPU-a0"], "started_at": value}, "started_at"),
        ("POST", "/api/v1/silences",
         {"matchers": {"node": "n"}, "comment": "c", "starts_at": value, "ends_at": ends},
         "starts_at"),
        ("PUT", "/api/v1/prices",
         [{"model_pattern": "*H100*", "usd_per_gpu_hour": 2.0, "effective_from": value}],
         "effective_from"),
    ]  # fmt: skip
    for method, path, body, field in cases:
        r = http.request(method, path, json=body, headers=admin)
        assert r.status_code == 422, (path, r.text)
        assert field in r.json()["detail"][0]["loc"], r.text
    started = {"id": "j2", "gpus": ["GPU-a0"], "started_at": iso(clock() - timedelta(hours=1))}
    assert http.post("/api/v1/jobs", json=started, headers=admin).status_code == 201
    r = http.patch("/api/v1/jobs/j2", json={"ended_at": value}, headers=admin)
    assert r.status_code == 422 and "ended_at" in r.json()["detail"][0]["loc"], r.text


def test_a_flag_in_an_admin_body_must_be_a_boolean(
    http: httpx.Client, tokens: dict[str, str], clock: FakeClock
) -> None:
    admin = auth(tokens["admin"])
    started = iso(clock() - timedelta(hours=1))
    job = {"id": "j3", "gpus": [], "started_at": started, "exclusive": 0}
    r = http.post("/api/v1/jobs", json=job, headers=admin)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "exclusive"], r.text
    policy = {"name": "p1", "metric": "sm_active", "aggregate": "avg", "window": "10m",
              "op": "<", "threshold": 0.3, "for": "15m", "scope": "gpu", "send_resolved": 1}  # fmt: skip
    r = http.post("/api/v1/policies", json=policy, headers=admin)
    assert r.status_code == 422 and "send_resolved" in r.json()["detail"][0]["loc"], r.text


@pytest.mark.parametrize("field", ["lost", "retired"])
@pytest.mark.parametrize("value", [0, 1, "true", None])
def test_a_gpu_flag_in_a_batch_must_be_a_boolean(
    http: httpx.Client, tokens: dict[str, str], clock: FakeClock, field: str, value: Any
) -> None:
    batch = make_batch(start=clock() - timedelta(seconds=30))
    batch["gpus"][0][field] = value
    r = http.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"]))
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "gpus", 0, field]
