"""Scenario: a hot GPU shows up in the site's own Alertmanager, kept alive, then resolved.

The test starts a real Alertmanager (/usr/bin/prometheus-alertmanager, Debian package
prometheus-alertmanager) on loopback on free ports. A real central service with an
`alertmanager` channel evaluates every second; a GPU reports 91 C. Alertmanager's own
API (`GET /api/v2/alerts`) then shows the alert with our labels and annotations; it is re-sent
while firing (endsAt keeps moving forward, as Alertmanager expects of a Prometheus-like
sender); when the GPU cools, the resolved alert (endsAt in the past) leaves the active list.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.alerting_support import auth, ingest, running_service, wait_until
from tests.conftest import make_token
from tests.support import free_port

AM_BINARY = "/usr/bin/prometheus-alertmanager"
AM_CONFIG = """\
route:
  receiver: blackhole
  group_wait: 1s
receivers:
  - name: blackhole
"""


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    """A real Alertmanager on a free loopback port; yields its base URL."""
    (tmp_path / "am.yml").write_text(AM_CONFIG)
    port = free_port()
    proc = subprocess.Popen(
        [
            AM_BINARY,
            f"--config.file={tmp_path / 'am.yml'}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(url + "/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("alertmanager did not start")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def am_alerts(am: str) -> list[dict]:  # type: ignore[type-arg]
    r = httpx.get(am + "/api/v2/alerts", params={"filter": 'alertname="hot-gpu"'}, timeout=5)
    r.raise_for_status()
    return r.json()  # type: ignore[no-any-return]


def test_hot_gpu_alert_lives_in_alertmanager(engine, alertmanager: str) -> None:
    with (
        running_service(engine, alertmanager_resend_seconds=1.0) as (url, _ctx),
        httpx.Client(base_url=url) as http,
    ):
        admin = auth(make_token(engine, "admin"))
        agent = make_token(engine, "agent", "node-a")
        channel = {"name": "am", "type": "alertmanager", "url": alertmanager}
        assert http.post("/api/v1/channels", json=channel, headers=admin).status_code == 201
        policy = {
            "name": "hot-gpu",
            "metric": "temperature_celsius",
            "aggregate": "avg",
            "window": "5s",
            "op": ">",
            "threshold": 85,
            "for": "0s",
            "scope": "gpu",
            "severity": "warning",
            "channels": ["am"],
            "description": "GPU core above 85 C",
        }
        assert http.post("/api/v1/policies", json=policy, headers=admin).status_code == 201
        ingest(
            http,
            agent,
            start=datetime.now(UTC) - timedelta(seconds=2),
            count=1,
            metrics={"temperature_celsius": 91.0, "sm_active": 0.9},
        )

        (alert,) = wait_until(lambda: am_alerts(alertmanager), timeout=20)
        labels = alert["labels"]
        assert labels["alertname"] == "hot-gpu" and labels["severity"] == "warning"
        assert labels["gpu"] == "GPU-a0" and labels["node"] == "node-a" and labels["scope"] == "gpu"
        assert alert["annotations"]["summary"] == "[FIRING] hot-gpu on gpu GPU-a0"
        assert "avg temperature_celsius over 5s = 91" in alert["annotations"]["description"]
        assert alert["status"]["state"] == "active"
        ends_first = alert["endsAt"]

        # Re-sent while firing: Alertmanager sees endsAt move forward.
        def moved() -> bool:
            current = am_alerts(alertmanager)
            return bool(current) and current[0]["endsAt"] > ends_first

        for _ in range(6):
            ingest(
                http,
                agent,
                start=datetime.now(UTC),
                count=1,
                metrics={"temperature_celsius": 91.0, "sm_active": 0.9},
            )
            if moved():
                break
            time.sleep(1)
        assert moved()

        # It cools down: the resolved alert leaves Alertmanager's active list.
        for _ in range(15):
            ingest(
                http,
                agent,
                start=datetime.now(UTC),
                count=1,
                metrics={"temperature_celsius": 60.0, "sm_active": 0.9},
            )
            if not am_alerts(alertmanager):
                break
            time.sleep(1)
        assert am_alerts(alertmanager) == []
        (ours,) = http.get("/api/v1/alerts", params={"policy": "hot-gpu"}, headers=admin).json()
        assert ours["state"] == "resolved"
