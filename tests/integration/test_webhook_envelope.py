"""The webhook body is a Standard Webhooks payload, read back by both reference libraries.

GPU Warden's webhook notifier posts a real alert to a real HTTP receiver on loopback; the body
and headers it got are then verified and parsed by the Standard Webhooks library for Python
(``standardwebhooks`` from PyPI) and by the one for JavaScript (npm ``standardwebhooks``, run
with node from tests/js; scripts/test-services.sh installs it). Both must accept the signature
and find the envelope the specification defines: ``type``, ``timestamp`` (ISO 8601, when the
event happened) and ``data``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from service.notify import Notification
from service.notify.webhook import WebhookNotifier
from service.thresholds.policy import ChannelSpec
from tests.receivers import Received, Receiver

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
JS = Path(__file__).resolve().parents[1] / "js"
FIRED = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
RESOLVED = datetime(2026, 12, 2, 8, 30, tzinfo=UTC)

VERIFY_JS = """
const { Webhook } = require("standardwebhooks");
let input = "";
process.stdin.on("data", (c) => (input += c));
process.stdin.on("end", () => {
  const { secret, body, headers } = JSON.parse(input);
  const payload = new Webhook(secret.replace(/^whsec_/, "")).verify(body, headers);
  process.stdout.write(JSON.stringify(payload));
});
"""


def note(**kw: object) -> Notification:
    doc: dict[str, object] = {
        "delivery_id": "msg_2NhYQ3nV1x",
        "kind": "firing",
        "status": "firing",
        "policy": "idle-held-gpu",
        "severity": "warning",
        "metric": "idle_held",
        "aggregate": "avg",
        "window": "30m",
        "op": ">=",
        "threshold": 1.0,
        "value": 1.0,
        "scope": "gpu",
        "scope_key": "gpu:GPU-a0",
        "labels": {"gpu_uuid": "GPU-a0", "node": "node-a", "job_id": "k8s:ml/serve-0"},
        "active_since": FIRED,
        "fired_at": FIRED,
    }
    return Notification.model_validate(doc | kw)


def deliver(n: Notification) -> Received:
    receiver = Receiver()
    try:
        channel = ChannelSpec(name="ops", type="webhook", url=receiver.url + "/hook", secret=SECRET)
        with httpx.Client() as client:
            WebhookNotifier(channel, client, clock=lambda: datetime.now(UTC)).send(n)
        (got,) = receiver.received
        return got
    finally:
        receiver.close()


def verified_by_node(got: Received) -> Any:
    node = shutil.which("node")
    if node is None or not (JS / "node_modules" / "standardwebhooks").is_dir():
        why = "node and tests/js/node_modules are needed (scripts/test-services.sh installs them)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    doc = {"secret": SECRET, "body": got.body.decode(), "headers": got.headers}
    done = subprocess.run(
        [node, "-e", VERIFY_JS],
        input=json.dumps(doc),
        capture_output=True,
        text=True,
        cwd=JS,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    ("n", "kind", "when"),
    [
        (note(), "alert.firing", FIRED),
        (
            note(kind="resolved", status="resolved", resolved_at=RESOLVED),
            "alert.resolved",
            RESOLVED,
        ),
    ],
    ids=["firing", "resolved"],
)
def test_both_standard_webhooks_libraries_verify_and_read_the_envelope(
    n: Notification, kind: str, when: datetime
) -> None:
    got = deliver(n)
    by_python = Webhook(SECRET).verify(got.body, got.headers)
    by_node = verified_by_node(got)
    assert by_python == by_node
    assert set(by_python) == {"type", "timestamp", "data"}
    assert by_python["type"] == kind
    assert datetime.fromisoformat(by_python["timestamp"]) == when
    data = by_python["data"]
    assert data["policy"] == "idle-held-gpu" and data["state"] == n.status
    assert data["labels"]["job_id"] == "k8s:ml/serve-0"
    assert data["delivery_id"] == got.headers["webhook-id"]
