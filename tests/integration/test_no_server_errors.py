"""Inputs that once answered 500 now answer a 4xx naming what was wrong (SQLite and PostgreSQL)."""

from __future__ import annotations

import gzip
import json
import zlib

import httpx
import pytest

from tests.alerting_support import auth, low_sm_policy
from tests.support import make_batch

FAR_PAST = "0001-01-01T00:00:00Z"
BEYOND_INT64 = "99999999999999999999"


@pytest.mark.parametrize(
    "path",
    [
        f"/api/v1/gpus/GPU-x/series?metric=sm_active&end={FAR_PAST}",
        f"/api/v1/reports/cost?end={FAR_PAST}",
        f"/api/v1/jobs?end={FAR_PAST}",
        "/api/v1/jobs?start=9999-12-31T23:59:59Z",
        f"/api/v1/alerts/{BEYOND_INT64}",
        "/api/v1/gpus?node=a%00b",
        "/api/v1/jobs/a%00b",
        "/api/v1/alerts?policy=a%00b",
    ],
)
def test_bad_query_input_is_a_4xx(http: httpx.Client, tokens, path: str) -> None:
    r = http.get(path, headers=auth(tokens["admin"]))
    assert 400 <= r.status_code < 500, (r.status_code, r.text)


def test_unknown_ids_are_404(http: httpx.Client, tokens) -> None:
    admin = auth(tokens["admin"])
    assert http.get("/api/v1/alerts/99999999999", headers=admin).status_code == 404
    assert http.get("/api/v1/alerts/-1", headers=admin).status_code == 404
    assert http.delete("/api/v1/silences/99999999999", headers=admin).status_code == 404
    assert http.delete(f"/api/v1/silences/{BEYOND_INT64}", headers=admin).status_code == 404


def test_nul_in_a_body_string_names_the_field(http: httpx.Client, tokens) -> None:
    admin = auth(tokens["admin"])
    silence = {
        "matchers": {"node": "n1"},
        "ends_at": "2027-01-01T00:00:00Z",
        "comment": "a\u0000b",
    }
    r = http.post("/api/v1/silences", json=silence, headers=admin)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "comment"]
    job = {"id": "j\u0000", "user": "u", "gpus": [], "started_at": "2026-12-02T07:00:00Z"}
    r = http.post("/api/v1/jobs", json=job, headers=admin)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "id"], r.text


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_policy_threshold_is_refused(http: httpx.Client, tokens, value: str) -> None:
    body = json.dumps(low_sm_policy([])).replace('"threshold": 0.3', f'"threshold": {value}')
    assert value in body
    r = http.post(
        "/api/v1/policies",
        content=body,
        headers=auth(tokens["admin"]) | {"Content-Type": "application/json"},
    )
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "threshold"], r.text


@pytest.mark.parametrize("field", ["window", "for", "repeat_interval"])
def test_durations_are_bounded(http: httpx.Client, tokens, field: str) -> None:
    policy = low_sm_policy([]) | {field: "99999999999d"}
    r = http.post("/api/v1/policies", json=policy, headers=auth(tokens["admin"]))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", field], r.text


@pytest.mark.parametrize(
    ("encoding", "encode"),
    [
        ("deflate", zlib.compress),
        ("gzip, gzip", lambda b: gzip.compress(gzip.compress(b))),
        ("br", lambda b: b),
    ],
)
def test_unsupported_content_encodings_are_415(
    http: httpx.Client, tokens, clock, encoding: str, encode
) -> None:
    body = encode(json.dumps(make_batch(start=clock())).encode())
    r = http.post(
        "/api/v1/ingest",
        content=body,
        headers=auth(tokens["agent"])
        | {"Content-Type": "application/json", "Content-Encoding": encoding},
    )
    assert r.status_code == 415, r.text
    assert "gzip" in r.json()["detail"]
