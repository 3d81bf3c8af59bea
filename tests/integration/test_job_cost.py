"""Alert dollars: a job's waste at the most specific current price; no secrets leak."""

from __future__ import annotations

import logging
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import insert

from service.db.schema import prices
from service.usecases.job_summary import job_waste_usd
from service.usecases.upkeep import rollup_once
from tests.alerting_support import add_job, auth, ingest
from tests.receivers import Receiver
from tests.support import FakeClock


def test_waste_usd_uses_most_specific_latest_price(
    app, http: httpx.Client, tokens, engine, clock: FakeClock
) -> None:
    ctx = app.state.ctx
    start = clock() - timedelta(minutes=10)
    # 10 minutes idle on one GPU -> 10 wasted GPU-minutes (rollups cover whole minutes)
    ingest(http, tokens["agent"], start=start, count=60, metrics={"sm_active": 0.0})
    add_job(engine, "j1", ("GPU-a0",), started_at=start)
    rollup_once(ctx)
    with engine.begin() as conn:
        conn.execute(
            insert(prices),
            [
                {
                    "model_pattern": "*",
                    "usd_per_gpu_hour": 1.0,
                    "effective_from": start - timedelta(days=9),
                },
                {
                    "model_pattern": "*H100*",
                    "usd_per_gpu_hour": 2.0,
                    "effective_from": start - timedelta(days=9),
                },
                {
                    "model_pattern": "*H100*",
                    "usd_per_gpu_hour": 6.0,
                    "effective_from": start - timedelta(days=1),
                },
                {
                    "model_pattern": "*H100*",
                    "usd_per_gpu_hour": 99.0,
                    "effective_from": clock() + timedelta(days=1),
                },
            ],
        )
    with engine.connect() as conn:
        usd = job_waste_usd(conn, job_id="j1", now=clock(), settings=ctx.settings)
    # $6/h (newest effective *H100*) x ~1/6 h idle
    assert usd == pytest.approx(6.0 * 10 / 60, rel=0.12)


def test_secrets_stay_out_of_logs_and_errors(app, http: httpx.Client, tokens, caplog) -> None:
    from service.usecases.outbox import Dispatcher

    app.state.ctx.settings.webhook_allow_nets = "127.0.0.0/8"
    receiver = Receiver(script=[(500, {})])
    try:
        url = receiver.url + "/services/T0/B0/tOpSeCrEt"
        r = http.post(
            "/api/v1/channels",
            json={"name": "s", "type": "slack", "url": url},
            headers=auth(tokens["admin"]),
        )
        assert r.status_code == 201 and "tOpSeCrEt" not in r.text
        with caplog.at_level(logging.DEBUG):
            r = http.post("/api/v1/channels/s/test", headers=auth(tokens["admin"]))
            assert r.status_code == 502 and "HTTP 500" in r.json()["error"]
            Dispatcher(app.state.ctx).client.close()
        assert "tOpSeCrEt" not in r.text
        assert "tOpSeCrEt" not in caplog.text
    finally:
        receiver.close()
