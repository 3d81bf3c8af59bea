"""Scenario: an XID on a GPU reaches the team's own webhook consumer, signed, despite a hiccup.

A real central service evaluates every second with the default hardware-fault policy
(critical, at once). The team's consumer, a real HTTP server on loopback, verifies the Standard
Webhooks HMAC itself (HMAC-SHA256 over `id.timestamp.body` with the base64 key after whsec_) and
answers 503 to the first delivery. GPU Warden retries with the same webhook-id; the consumer
accepts it. The body names the policy, the state and the scope's labels. When the XID ages out
of the window, a signed `resolved` delivery follows.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from tests.alerting_support import SECRET, auth, ingest, running_service, wait_until
from tests.conftest import make_token
from tests.receivers import Received, Receiver


def verify(secret: str, got: Received) -> dict[str, Any]:
    """What a consumer does: recompute the signature and check the timestamp is recent."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    msg_id, ts = got.headers["webhook-id"], got.headers["webhook-timestamp"]
    assert abs(time.time() - int(ts)) < 300
    expected = base64.b64encode(
        hmac.new(key, f"{msg_id}.{ts}.".encode() + got.body, hashlib.sha256).digest()
    ).decode()
    signatures = [s.split(",", 1)[1] for s in got.headers["webhook-signature"].split()]
    assert any(hmac.compare_digest(expected, s) for s in signatures), "bad signature"
    return got.json()["data"]  # type: ignore[no-any-return]


def test_xid_alert_is_signed_retried_and_resolved(engine) -> None:
    consumer = Receiver(script=[(503, {})])
    try:
        with running_service(engine) as (url, _ctx), httpx.Client(base_url=url) as http:
            admin = auth(make_token(engine, "admin"))
            agent = make_token(engine, "agent", "node-a")
            hook = {
                "name": "ops",
                "type": "webhook",
                "url": consumer.url + "/gpu",
                "secret": SECRET,
            }
            assert http.post("/api/v1/channels", json=hook, headers=admin).status_code == 201
            policy = {
                "name": "gpu-hardware-fault",
                "metric": "hardware_fault",
                "aggregate": "max",
                "window": "8s",
                "op": ">=",
                "threshold": 1,
                "for": "0s",
                "scope": "gpu",
                "severity": "critical",
                "channels": ["ops"],
                "repeat_interval": "1h",
            }
            r = http.post("/api/v1/policies", json=policy, headers=admin)
            assert r.status_code == 201, r.text
            now = datetime.now(UTC)
            ingest(
                http,
                agent,
                start=now - timedelta(seconds=30),
                count=3,
                metrics={"sm_active": 0.9},
                gpu_uuids=("GPU-a0", "GPU-a1"),
            )
            ingest(
                http,
                agent,
                start=now - timedelta(seconds=1),
                count=1,
                metrics={"sm_active": 0.0, "xid_last": 79},
                gpu_uuids=("GPU-a1",),
            )

            # 503 first; the retry comes 1-2 s later with the same id.
            first, retry = wait_until(
                lambda: consumer.received[:2] if len(consumer.received) >= 2 else None, timeout=20
            )
            assert first.headers["webhook-id"] == retry.headers["webhook-id"]
            assert 0.8 <= retry.at - first.at <= 6
            body = verify(SECRET, retry)
            assert body["policy"] == "gpu-hardware-fault" and body["state"] == "firing"
            assert (
                body["severity"] == "critical"
                and body["delivery_id"] == retry.headers["webhook-id"]
            )
            assert body["labels"] == {
                "node": "node-a",
                "gpu_uuid": "GPU-a1",
                "gpu_index": "0",  # the batch reports GPU-a1 alone, as index 0
                "model": "NVIDIA H100 80GB HBM3",
                "policy": "gpu-hardware-fault",
                "severity": "critical",
            }

            # Fresh samples without XID; once the XID leaves the 8 s window the alert resolves.
            for _ in range(25):
                ingest(
                    http,
                    agent,
                    start=datetime.now(UTC),
                    count=1,
                    metrics={"sm_active": 0.9},
                    gpu_uuids=("GPU-a0", "GPU-a1"),
                )
                if len(consumer.received) >= 3:
                    break
                time.sleep(1)
            resolved = wait_until(
                lambda: consumer.received[2] if len(consumer.received) >= 3 else None
            )
            body = verify(SECRET, resolved)
            assert body["state"] == "resolved" and body["labels"]["gpu_uuid"] == "GPU-a1"
            assert resolved.headers["webhook-id"] != first.headers["webhook-id"]
            # A forged body does not verify.
            forged = Received(
                resolved.path, resolved.headers, resolved.body.replace(b"resolved", b"firing"), 0
            )
            try:
                verify(SECRET, forged)
            except AssertionError:
                pass
            else:
                raise AssertionError("a forged body verified")
            metrics = http.get("/metrics").text
            assert 'gpuwarden_notifications_total{channel="ops",outcome="retry"} 1.0' in metrics
            assert 'gpuwarden_notifications_total{channel="ops",outcome="sent"} 2.0' in metrics
            assert "gpuwarden_outbox_depth 0.0" in metrics
    finally:
        consumer.close()
