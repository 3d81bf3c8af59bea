"""Scenario: an alert fires while the team's webhook receiver is down and central is killed.

A real ``gpuwarden serve`` process evaluates a hot-GPU policy every half second. The receiver's
port refuses connections when the alert fires, so the notification waits in the outbox and is
retried with backoff (never given up); central is then killed with SIGKILL and started again.
When the receiver comes up it answers 503 once, then 200. The notification arrives exactly
once (one 200, every attempt with the same webhook-id), and nothing else is sent.
"""

from __future__ import annotations

import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy import Engine, select

from service.db.schema import outbox
from service.settings import Settings
from tests.conftest import make_token
from tests.process_support import start_central, stop, wait_until
from tests.receivers import Receiver
from tests.support import free_port, make_batch

CONFIG = """\
channels:
  - name: ops
    type: webhook
    url: http://127.0.0.1:{port}/hook
policies:
  - name: hot-gpu
    metric: temperature_celsius
    aggregate: max
    window: 1m
    op: ">"
    threshold: 85
    for: 0s
    scope: gpu
    severity: warning
    channels: [ops]
    repeat_interval: 1h
    send_resolved: false
"""


def outbox_rows(engine: Engine) -> list[tuple[str, int]]:
    with engine.connect() as conn:
        return [(r.status, r.attempts) for r in conn.execute(select(outbox).order_by(outbox.c.id))]


def test_a_notification_survives_a_receiver_outage_and_a_central_kill_exactly_once(
    engine: Engine, settings: Settings, tmp_path: Path
) -> None:
    receiver_port, port = free_port(), free_port()
    config = tmp_path / "gpuwarden.yaml"
    config.write_text(CONFIG.format(port=receiver_port))
    env = {
        "GPUWARDEN_CONFIG": str(config),
        "GPUWARDEN_EVAL_INTERVAL_SECONDS": "0.5",
        "GPUWARDEN_OUTBOX_INTERVAL_SECONDS": "0.5",
        "GPUWARDEN_WEBHOOK_ALLOW_NETS": "127.0.0.0/8",
    }
    log = tmp_path / "central.log"
    admin = make_token(engine, "admin")
    central = start_central(settings.database_url, port, log, env)
    receiver: Receiver | None = None
    try:
        batch = make_batch(
            gpu_uuids=("GPU-a0",),
            start=datetime.now(UTC) - timedelta(seconds=1),
            metrics={"temperature_celsius": 92.0, "sm_active": 0.9},
        )
        r = httpx.post(
            f"http://127.0.0.1:{port}/api/v1/ingest",
            json=batch,
            headers={"Authorization": f"Bearer {admin}"},
            timeout=10,
        )
        assert r.status_code == 200, r.text
        # The alert fires; its notification meets a closed port and is retried.
        wait_until("a failed attempt", lambda: any(a >= 1 for _, a in outbox_rows(engine)))
        stop(central, signal.SIGKILL)
        central = start_central(settings.database_url, port, log, env)
        wait_until("another attempt", lambda: any(a >= 2 for _, a in outbox_rows(engine)))
        receiver = Receiver(port=receiver_port, script=[(503, {})])
        wait_until(
            "the delivery",
            lambda: [s for s, _ in outbox_rows(engine)] == ["sent"],
            timeout=60,  # the backoff after a few failures: at most 16 s, then 32 s
        )
        time.sleep(3)  # six more evaluation and outbox rounds: nothing else may be sent
    finally:
        stop(central)
        if receiver is not None:
            receiver.close()
    assert receiver is not None
    got = [
        (m.json()["data"]["policy"], m.json()["data"]["state"], m.headers["webhook-id"])
        for m in receiver.received
    ]
    assert len(got) == 2, got  # the 503, then the 200
    assert {(p, s) for p, s, _ in got} == {("hot-gpu", "firing")}
    assert len({i for _, _, i in got}) == 1  # one notification, retried under one id
    ((status, attempts),) = outbox_rows(engine)
    assert status == "sent" and attempts >= 3
    assert "Traceback" not in log.read_text()
