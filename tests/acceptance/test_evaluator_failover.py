"""Scenario: two central replicas on one PostgreSQL; one evaluates and sends, the other takes over.

Two real `gpuwarden serve` processes share a fresh PostgreSQL database and one YAML config
(a webhook channel pointing at a loopback receiver, a hot-GPU policy that fires at once). Only
the holder of the PostgreSQL advisory lock evaluates and sends, so a GPU that gets hot produces
exactly one notification. The leader is then killed with SIGKILL; the other replica takes the
lock, keeps the already-firing alert without notifying it again, and notifies the next one.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import BinaryIO

import httpx
import pytest

from service.clock import utc_now
from service.db import tokens_repo
from service.db.engine import make_engine
from service.db.migrate import upgrade
from tests.acceptance.leader_support import is_leader
from tests.alerting_support import auth, wait_until
from tests.conftest import new_pg_database
from tests.receivers import Receiver
from tests.support import free_port, make_batch

CONFIG = """\
channels:
  - name: ops
    type: webhook
    url: {url}
policies:
  - name: hot-gpu
    metric: temperature_celsius
    aggregate: max
    window: 30s
    op: ">"
    threshold: 85
    for: 0s
    scope: gpu
    severity: warning
    channels: [ops]
    repeat_interval: 1h
    send_resolved: false
"""


@pytest.fixture
def fresh_pg() -> Iterator[str]:
    with new_pg_database("gpuwarden_failover") as url:
        yield url


def start_replica(db_url: str, config: Path, log: BinaryIO) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = os.environ | {
        "GPUWARDEN_DATABASE_URL": db_url,
        "GPUWARDEN_CONFIG": str(config),
        "GPUWARDEN_EVAL_INTERVAL_SECONDS": "0.5",
        "GPUWARDEN_OUTBOX_INTERVAL_SECONDS": "0.5",
        "GPUWARDEN_WEBHOOK_ALLOW_NETS": "127.0.0.0/8",
        "GPUWARDEN_LOG_LEVEL": "INFO",
    }
    gpuwarden = str(Path(sys.executable).parent / "gpuwarden")
    proc = subprocess.Popen(
        [gpuwarden, "serve", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return proc, f"http://127.0.0.1:{port}"


def test_one_notification_per_transition_and_takeover(fresh_pg: str, tmp_path: Path) -> None:
    engine = make_engine(fresh_pg)
    upgrade(engine)
    with engine.begin() as conn:
        admin, _ = tokens_repo.create_token(
            conn, role=tokens_repo.Role.ADMIN, node=None, name=None, now=utc_now()
        )
    engine.dispose()
    receiver = Receiver()
    config = tmp_path / "gpuwarden.yaml"
    config.write_text(CONFIG.format(url=receiver.url + "/hook"))
    logs = [(tmp_path / f"replica{i}.log").open("wb") for i in range(2)]
    replicas = [start_replica(fresh_pg, config, log) for log in logs]
    try:
        for _proc, url in replicas:
            wait_until(functools.partial(_healthy, url), timeout=60)
        leader_idx = wait_until(
            lambda: [i for i, (_, u) in enumerate(replicas) if is_leader(u)] or None, timeout=15
        )
        assert len(leader_idx) == 1, "exactly one replica holds the lock"
        leader, follower = replicas[leader_idx[0]], replicas[1 - leader_idx[0]]

        def hot(gpu: str, via: str) -> None:
            batch = make_batch(
                gpu_uuids=(gpu,),
                start=datetime.now(UTC) - timedelta(seconds=1),
                metrics={"temperature_celsius": 92.0, "sm_active": 0.9},
            )
            r = httpx.post(via + "/api/v1/ingest", json=batch, headers=auth(admin), timeout=10)
            assert r.status_code == 200, r.text

        hot("GPU-a0", follower[1])  # data may arrive at any replica
        wait_until(lambda: receiver.received, timeout=15)
        time.sleep(3)  # six more evaluation rounds on each replica
        assert [
            (m.json()["data"]["labels"]["gpu_uuid"], m.json()["data"]["state"])
            for m in receiver.received
        ] == [("GPU-a0", "firing")]

        leader[0].send_signal(signal.SIGKILL)
        leader[0].wait(10)
        wait_until(lambda: is_leader(follower[1]), timeout=30)
        hot("GPU-a1", follower[1])
        wait_until(lambda: len(receiver.received) >= 2, timeout=15)
        time.sleep(3)
        got = [
            (m.json()["data"]["labels"]["gpu_uuid"], m.json()["data"]["state"])
            for m in receiver.received
        ]
        assert got == [("GPU-a0", "firing"), ("GPU-a1", "firing")], got
        ids = [m.headers["webhook-id"] for m in receiver.received]
        assert len(set(ids)) == 2
    finally:
        for proc, _ in replicas:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(15)
        receiver.close()
        for log in logs:
            log.close()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
