"""Reads off a real PostgreSQL streaming replica, writes to the primary.

The primary is a private cluster (initdb on a free port), the replica its pg_basebackup -R copy
running as a hot standby on another port; central serves on loopback with
GPUWARDEN_DATABASE_READ_URL naming the replica. Writes through the API appear in GET routes read
from the replica; a caller's read right after its own write goes to the primary; a replica
behind the allowed lag, or stopped, sends reads to the primary (counted, never an error); the
lag is reported in /healthz and /metrics.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from service.api.app import create_app
from service.clock import utc_now
from service.db import tokens_repo
from service.db.engine import make_engine
from service.db.migrate import upgrade
from service.reads import ReadRouter
from service.settings import Settings
from service.telemetry import Telemetry
from tests.conftest import _pg_url
from tests.pg_cluster import Cluster, private_cluster, streaming_replica
from tests.process_support import wait_until
from tests.support import iso, live_server, make_batch

MAX_LAG_SECONDS = 2.0
# While replay is paused the lag grows with the wall clock: the test starts with a limit no
# pause reaches, so what it asserts does not depend on how fast this machine is.
NEVER_SECONDS = 3600.0


@pytest.fixture
def clusters() -> Iterator[tuple[Cluster, Cluster]]:
    with private_cluster() as primary:
        primary.sql("CREATE DATABASE gpuwarden")
        with streaming_replica(primary) as replica:
            yield primary, replica


def _db(cluster: Cluster) -> str:
    return cluster.url.rsplit("/", 1)[0] + "/gpuwarden"


def _reads(base: str) -> dict[str, float]:
    text = httpx.get(f"{base}/metrics").text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "gpuwarden_replica_reads_total":
                out[s.labels["outcome"]] = s.value
            elif s.name.startswith("gpuwarden_replica_"):
                out[s.name] = s.value
    return out


def _caught_up(state: dict[str, Any]) -> bool:
    return bool(state["status"] == "ok" and state["lag_bytes"] == 0 and state["lag_seconds"] == 0)


def _read_on_replica(base: str, headers: dict[str, str]) -> bool:
    """Whether a reader's GET was answered from the replica (its counter moved)."""
    before = _reads(base)["replica"]
    httpx.get(f"{base}/api/v1/gpus", headers=headers).raise_for_status()
    return _reads(base)["replica"] > before


def _replica_state(base: str) -> dict[str, Any]:
    state: dict[str, Any] = httpx.get(f"{base}/healthz").json()["read_replica"]
    return state


def _reads_that_sum_costs_go_to_the_primary(base: str, headers: dict[str, str]) -> None:
    """The jobs and fleet pages and a report cut at any second join temporary tables, which a
    hot standby cannot create: they are answered, from the primary, and counted as such."""
    before = _reads(base)["costs"]
    end = utc_now()
    window = {"start": iso(end - timedelta(hours=1, seconds=13.5)), "end": iso(end)}
    for path, params in [
        ("/api/v1/jobs", {}),
        ("/api/v1/fleet", {}),
        ("/api/v1/reports/cost", {**window, "group_by": "team"}),
    ]:
        r = httpx.get(f"{base}{path}", params=params, headers=headers)
        assert r.status_code == 200, (path, r.text)
    assert _reads(base)["costs"] == before + 3
    assert _read_on_replica(base, headers)  # the other reads stay on the replica


def _no_read_fails_on_the_replica(app: FastAPI, base: str, headers: dict[str, str]) -> None:
    """Every GET of the API (its path parameters those of the batch's GPU, or of nothing
    stored) answers a reader without a server error while the replica serves reads."""
    values = {"uuid": "GPU-a0", "name": "nobody", "kind": "team", "alert_id": "1", "job_id": "1"}
    paths = sorted(
        path.format(**values)
        for path, ops in app.openapi()["paths"].items()
        if "get" in ops and path.startswith("/api/v1/")
    )
    assert len(paths) > 10 and "/api/v1/gpus/GPU-a0/series" in paths
    failed = {
        p: c for p in paths if (c := httpx.get(f"{base}{p}", headers=headers).status_code) >= 500
    }
    assert failed == {}
    assert "gpuwarden_fleet_metrics_up 1.0" in httpx.get(f"{base}/metrics").text


def test_reads_go_to_the_replica_and_fall_back_to_the_primary(
    clusters: tuple[Cluster, Cluster], caplog: pytest.LogCaptureFixture
) -> None:
    primary, replica = clusters
    engine = make_engine(_db(primary))
    upgrade(engine)
    with engine.begin() as conn:
        now = utc_now()
        agent, _ = tokens_repo.create_token(
            conn, role=tokens_repo.Role.AGENT, node="node-a", name=None, now=now
        )
        admin, _ = tokens_repo.create_token(
            conn, role=tokens_repo.Role.ADMIN, node=None, name=None, now=now
        )
        reader, _ = tokens_repo.create_token(
            conn, role=tokens_repo.Role.READER, node=None, name=None, now=now
        )
    settings = Settings(
        database_url=_db(primary),
        database_read_url=_db(replica),
        database_read_max_lag_seconds=NEVER_SECONDS,
        database_read_check_seconds=0.2,
        run_scheduler=False,
    )
    as_agent, as_admin, as_reader = (
        {"Authorization": f"Bearer {t}"} for t in (agent, admin, reader)
    )
    silence = {"matchers": {"node": "node-a"}, "comment": "maintenance"}
    try:
        app = create_app(settings)
        with live_server(app) as base:
            # 1. An agent's batch, written to the primary, read by a reader from the replica.
            batch = make_batch(start=utc_now() - timedelta(seconds=30), count=3)
            r = httpx.post(f"{base}/api/v1/ingest", json=batch, headers=as_agent)
            assert r.status_code in (200, 202), r.text
            wait_until(
                "the GPU listed from the replica",
                lambda: [g["uuid"] for g in httpx.get(
                    f"{base}/api/v1/gpus", headers=as_reader
                ).json()] == ["GPU-a0"],
            )  # fmt: skip
            wait_until("the replica caught up", lambda: _caught_up(_replica_state(base)))
            wait_until("a read on the replica", lambda: _read_on_replica(base, as_reader))
            _reads_that_sum_costs_go_to_the_primary(base, as_reader)
            _no_read_fails_on_the_replica(app, base, as_reader)
            after = _reads(base)
            assert after["gpuwarden_replica_up"] == 1.0
            assert 0 <= after["gpuwarden_replica_lag_seconds"] <= NEVER_SECONDS

            # 2. Replay paused: the replica cannot show anything new. The admin's own write is
            # read back at once (from the primary); the reader, who wrote nothing, reads the
            # replica and does not see it yet.
            replica.sql("SELECT pg_wal_replay_pause()")
            ends = iso(utc_now() + timedelta(hours=1))
            r = httpx.post(
                f"{base}/api/v1/silences", json={**silence, "ends_at": ends}, headers=as_admin
            )
            assert r.status_code == 201, r.text
            silence_id = r.json()["id"]
            mine = httpx.get(f"{base}/api/v1/silences", headers=as_admin).json()
            assert [s["id"] for s in mine] == [silence_id]
            assert _reads(base)["own_write"] >= 1
            assert httpx.get(f"{base}/api/v1/silences", headers=as_reader).json() == []
            # Past the allowed lag, the reader's reads go to the primary too.
            app.state.ctx.reads.max_lag_seconds = MAX_LAG_SECONDS
            wait_until(
                "the reader's read from the primary",
                lambda: [s["id"] for s in httpx.get(
                    f"{base}/api/v1/silences", headers=as_reader
                ).json()] == [silence_id],
            )  # fmt: skip
            state = _replica_state(base)
            assert state["status"] == "lagging" and state["lag_bytes"] > 0, state
            assert state["lag_seconds"] is None or state["lag_seconds"] > MAX_LAG_SECONDS
            assert _reads(base)["lagging"] >= 1
            replica.sql("SELECT pg_wal_replay_resume()")
            wait_until(
                "the replica caught up again", lambda: _replica_state(base)["status"] == "ok"
            )

            # 3. The replica stopped: every read answered from the primary, logged and counted.
            replica.stop("fast")
            with caplog.at_level(logging.WARNING, logger="service.reads"):
                for _ in range(5):
                    r = httpx.get(f"{base}/api/v1/silences", headers=as_reader)
                    assert r.status_code == 200, r.text
                    assert [s["id"] for s in r.json()] == [silence_id]
                    assert httpx.get(f"{base}/api/v1/gpus", headers=as_reader).status_code == 200
            assert "the read replica" in caplog.text and "primary instead" in caplog.text
            assert _replica_state(base)["status"] == "down"
            down = _reads(base)
            assert down["down"] >= 1 and down["gpuwarden_replica_up"] == 0.0
            assert "gpuwarden_fleet_gpus" in httpx.get(f"{base}/metrics").text  # /metrics too

            # 4. Back: reads return to the replica on their own.
            replica.start()
            wait_until("the replica back", lambda: _replica_state(base)["status"] == "ok")
            wait_until("reads on the replica again", lambda: _read_on_replica(base, as_reader))
    finally:
        engine.dispose()


def test_a_server_that_is_not_replicating_serves_no_reads() -> None:
    # The primary named as its own replica (or a promoted one): it follows nothing, so reads
    # stay on the primary and the state says why.
    engine = make_engine(_pg_url("postgres"))
    router = ReadRouter(primary=engine, replica=engine, telemetry=Telemetry())
    try:
        state = router.state()
        assert state is not None and state.status == "not_replicating", state
        assert router.route(None) == (engine, "not_replicating")
        with router.connect() as conn:
            assert conn.exec_driver_sql("SELECT 1").scalar_one() == 1
        assert router._metrics.reads.labels("not_replicating")._value.get() == 1
    finally:
        engine.dispose()
