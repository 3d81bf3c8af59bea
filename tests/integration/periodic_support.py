"""What the periodic report tests share: a webhook receiver and a week of reports."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from service.api.app import create_app
from service.settings import Settings
from tests.alerting_support import auth
from tests.conftest import make_token
from tests.integration.cost_data import roll_up, store_series, worked_example_metrics
from tests.receivers import Receiver
from tests.smtp_support import SmtpServer
from tests.support import FakeClock, iso, live_server

T0 = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)  # alice's job: 06:00-07:00 on Wednesday
BOB_AT = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)  # bob's job, the week before


@pytest.fixture
def week(engine: Engine, receiver: Receiver) -> Iterator[tuple[httpx.Client, Any, FakeClock]]:
    """Alice (team vision) ran the worked example this week and an idle job last week, bob
    (team nlp) an idle job last week only;
    the clock stands on Monday 01:00 after that week, a webhook channel "hook" takes reports."""
    clock = FakeClock()
    store_series(engine, clock, uuid="GPU-b0", start=BOB_AT, hostname="node-b",
                 metrics=worked_example_metrics()[:180])  # fmt: skip
    store_series(engine, clock, uuid="GPU-a0", start=T0, metrics=worked_example_metrics())
    roll_up(engine)
    clock.set(datetime(2026, 12, 7, 1, 0, tzinfo=UTC))
    app = create_app(service_settings(engine), engine=engine, clock=clock)
    admin = auth(make_token(engine, "admin"))
    with live_server(app) as url, httpx.Client(base_url=url, headers=admin) as http:
        prices = [{"model_pattern": "*H100*", "usd_per_gpu_hour": 4.0,
                   "effective_from": "2026-01-01T00:00:00Z"}]  # fmt: skip
        assert http.put("/api/v1/prices", json=prices).status_code == 200
        for job_id, user, team, gpu, at, minutes in (
            ("slurm:1", "alice", "vision", "GPU-a0", T0, 60),
            ("slurm:2", "bob", "nlp", "GPU-b0", BOB_AT, 15),
            ("slurm:3", "alice", "vision", "GPU-b0", BOB_AT + timedelta(minutes=15), 15),
        ):
            body = {"id": job_id, "user": user, "team": team, "gpus": [gpu],
                    "started_at": iso(at), "ended_at": iso(at + timedelta(minutes=minutes))}  # fmt: skip
            assert http.post("/api/v1/jobs", json=body).status_code == 201
        channel = {"name": "hook", "type": "webhook", "url": receiver.url + "/reports"}
        assert http.post("/api/v1/channels", json=channel).status_code == 201
        yield http, app.state.ctx, clock


def service_settings(engine: Engine, **overrides: Any) -> Settings:
    return Settings(
        database_url=str(engine.url.render_as_string(hide_password=False)),
        run_scheduler=False,
        webhook_allow_nets="127.0.0.0/8",
        public_url="https://warden.example",
        report_channels="hook",
        **overrides,
    )


def mail_the_owners(http: httpx.Client, ctx: Any, smtp: SmtpServer) -> None:
    """Reports go by mail (channel "mail") to ``smtp``: alice, team vision and the admins have
    addresses, bob none."""
    smtp.send_here(ctx.settings)
    assert http.post("/api/v1/channels", json={"name": "mail", "type": "email"}).status_code == 201
    for entry in (
        {"kind": "user", "name": "alice", "email": "alice@example.org", "team": "vision"},
        {"kind": "team", "name": "vision", "email": "vision@example.org"},
        {"kind": "admins", "name": "admins", "email": "gpu-admins@example.org"},
    ):
        assert http.post("/api/v1/owners", json=entry).status_code == 201
