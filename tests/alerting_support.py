"""Helpers for the alerting tests: jobs and prices straight into the store, ingest over HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import Engine, insert, select

from service.db.schema import gpus, job_gpus, jobs, nodes, prices
from tests.support import auth as auth
from tests.support import live_server, make_batch

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def ingest(
    http: httpx.Client,
    token: str,
    *,
    start: datetime,
    count: int,
    metrics: dict[str, Any],
    gpu_uuids: tuple[str, ...] = ("GPU-a0",),
    hostname: str = "node-a",
) -> None:
    batch = make_batch(
        hostname=hostname, gpu_uuids=gpu_uuids, start=start, count=count, metrics=metrics
    )
    r = http.post("/api/v1/ingest", json=batch, headers=auth(token))
    assert r.status_code == 200, r.text


def add_job(
    engine: Engine,
    job_id: str,
    gpu_uuids: tuple[str, ...],
    *,
    started_at: datetime,
    user: str = "alice",
    team: str = "ml",
) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(jobs).values(
                id=job_id,
                user=user,
                team=team,
                project="llm",
                labels={},
                source="api",
                started_at=started_at,
                created_at=started_at,
                updated_at=started_at,
            )
        )
        for u in gpu_uuids:
            gid, node = conn.execute(
                select(gpus.c.id, nodes.c.hostname)
                .join(nodes, nodes.c.id == gpus.c.node_id)
                .where(gpus.c.uuid == u)
            ).one()
            # Registered as the GPU's node's agent would: by that node.
            conn.execute(
                insert(job_gpus).values(
                    job_id=job_id, gpu_id=gid, started_at=started_at, source="api",
                    registered_node=node,
                )
            )  # fmt: skip


def add_price(engine: Engine, pattern: str, usd: float, since: datetime) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(prices).values(
                model_pattern=pattern,
                usd_per_gpu_hour=usd,
                effective_from=since - timedelta(days=30),
            )
        )


def low_sm_policy(channels: list[str], **kw: Any) -> dict[str, Any]:
    return {
        "name": "low-sm-activity",
        "metric": "sm_active",
        "aggregate": "avg",
        "window": "5m",
        "op": "<",
        "threshold": 0.3,
        "for": "0s",
        "scope": "job",
        "severity": "warning",
        "channels": channels,
        "repeat_interval": "1h",
        "send_resolved": True,
    } | kw


@contextmanager
def running_service(engine: Engine, **overrides: Any) -> Iterator[tuple[str, Any]]:
    """The real central service (scheduler on, real clock) on loopback; yields (url, ctx)."""
    from service.api.app import create_app
    from service.settings import Settings

    defaults: dict[str, Any] = {
        "run_scheduler": True,
        "eval_interval_seconds": 1.0,
        "outbox_interval_seconds": 0.5,
        "rollup_interval_seconds": 2.0,
        "webhook_allow_nets": "127.0.0.0/8",
        "public_url": "https://warden.example",
    }
    settings = Settings(
        database_url=str(engine.url.render_as_string(hide_password=False)),
        **(defaults | overrides),
    )
    app = create_app(settings, engine=engine)
    with live_server(app) as url:
        yield url, app.state.ctx


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, every: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"condition not met within {timeout} s")
