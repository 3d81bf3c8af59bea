"""Inputs that once answered 500 now answer a 4xx naming what was wrong (SQLite and PostgreSQL)."""

from __future__ import annotations

import gzip
import json
import logging
import zlib
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import insert

from service.db.engine import make_engine
from service.db.schema import policies
from service.usecases.evaluation import evaluate_once
from tests.alerting_support import auth, ingest, low_sm_policy
from tests.support import free_port, make_batch

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


def test_a_stored_policy_that_no_longer_validates_does_not_stop_the_others(
    app, http: httpx.Client, tokens, engine, clock
) -> None:
    # Stored before durations were bounded: evaluating it used to overflow and fail every round.
    legacy = low_sm_policy([], name="legacy", window="99999999999d", scope="gpu")
    with engine.begin() as conn:
        conn.execute(
            insert(policies).values(
                name="legacy", spec=legacy, source="api", created_at=clock(), updated_at=clock()
            )
        )
    good = low_sm_policy([], scope="gpu")
    assert (
        http.post("/api/v1/policies", json=good, headers=auth(tokens["admin"])).status_code == 201
    )
    start = clock() - timedelta(minutes=4)
    ingest(http, tokens["agent"], start=start, count=24, metrics={"sm_active": 0.1})
    result = evaluate_once(app.state.ctx)
    assert result.policies == 1 and result.failed_policies == []
    alerts = http.get("/api/v1/alerts", headers=auth(tokens["reader"])).json()
    assert [a["policy"] for a in alerts] == ["low-sm-activity"]
    assert [
        p["name"] for p in http.get("/api/v1/policies", headers=auth(tokens["reader"])).json()
    ] == ["low-sm-activity"]


def test_a_database_outage_answers_503_with_retry_after_logged_once(
    app, http: httpx.Client, tokens, caplog: pytest.LogCaptureFixture
) -> None:
    ctx = app.state.ctx
    reader = auth(tokens["reader"])
    assert http.get("/api/v1/gpus", headers=reader).status_code == 200  # token now cached
    good = ctx.engine
    # Nothing listens on this port: every connection is refused, as when PostgreSQL is down.
    # Writes use ctx.engine, reads the read router's primary: both point at the dead server.
    ctx.engine = ctx.reads.primary = make_engine(
        f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x"
    )
    try:
        with caplog.at_level(logging.WARNING, logger="service.api.outage"):
            answers = [http.get("/api/v1/gpus", headers=reader) for _ in range(5)]
        assert {r.status_code for r in answers} == {503}
        assert all(r.headers["Retry-After"].isdigit() for r in answers)
        assert "database is unavailable" in answers[0].json()["detail"]
        outage_lines = [r for r in caplog.records if "database unavailable" in r.getMessage()]
        assert len(outage_lines) == 1 and outage_lines[0].exc_info is None
    finally:
        ctx.engine.dispose()
        ctx.engine = ctx.reads.primary = good
    assert http.get("/api/v1/gpus", headers=reader).status_code == 200
