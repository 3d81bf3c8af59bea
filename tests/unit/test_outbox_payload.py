"""An alert's outbox payload is its Notification's JSON, and rows the hand-made form queued
before an upgrade still read back as the same notification."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast

from service.core.verdict import Verdict
from service.notify import Notification
from service.thresholds.evaluator import AlertState
from service.thresholds.policy import PolicySpec
from service.usecases.evaluation import notification
from service.usecases.outbox import outbox_row

NOW = datetime(2026, 12, 4, 5, 9, 1, 123456, tzinfo=UTC)
CTX = cast(
    Any,
    SimpleNamespace(
        settings=SimpleNamespace(
            public_url="https://warden.example/",
            alertmanager_resend_seconds=60.0,
            eval_interval_seconds=15.0,
        )
    ),
)
POLICY = PolicySpec(
    name="low-sm", metric="sm_active", op="<", threshold=0.3, scope="job", description="idle"
)
STATE = AlertState(
    policy="low-sm",
    key="job:slurm:42",
    state="firing",
    labels={"job_id": "slurm:42", "user": "alice", "node": "node-a"},
    value=0.1,
    active_since=NOW - timedelta(minutes=5),
    fired_at=NOW,
)
VERDICT = {
    "cost_usd": 3,
    "waste_usd": 1.5,
    "idle_usd": 1.0,
    "fixable_usd": 0.5,
    "top_cause": "launch_bound",
    "fix": "CUDA graphs",
    "fix_saving_usd": 0.25,
}
# A row as the round queued it before it built the Notification itself (a hand-made dict).
OLD_ROW = {
    "kind": "firing",
    "status": "firing",
    "policy": "low-sm",
    "severity": "warning",
    "description": "idle",
    "metric": "sm_active",
    "aggregate": "avg",
    "window": "5m",
    "op": "<",
    "threshold": 0.3,
    "value": 0.1,
    "scope": "job",
    "scope_key": "job:slurm:42",
    "labels": {
        "job_id": "slurm:42",
        "user": "alice",
        "node": "node-a",
        "policy": "low-sm",
        "severity": "warning",
    },
    "active_since": "2026-12-04T05:04:01.123456+00:00",
    "fired_at": "2026-12-04T05:09:01.123456+00:00",
    "resolved_at": None,
    "ends_at": "2026-12-04T05:13:01.123456+00:00",
    "stale": False,
    **VERDICT,
    "xid_code": None,
    "report_url": "https://warden.example/jobs/slurm%3A42",
    "alert_url": "https://warden.example/alerts#alert-7",
    "alert_id": 7,
    "delivery_id": "msg_old",
}


def test_the_payload_is_the_notifications_json_under_the_rows_delivery_id() -> None:
    note = notification(CTX, POLICY, STATE, "firing", 7, NOW, Verdict(**VERDICT))
    row = outbox_row(note, channel="slack", alert_id=7)
    stored = json.loads(json.dumps(row["payload"]))  # as the outbox's JSON column keeps it
    assert row["delivery_id"].startswith("msg_") and stored["delivery_id"] == row["delivery_id"]
    assert (row["channel"], row["alert_id"]) == ("slack", 7)
    assert Notification.model_validate(stored) == note.model_copy(
        update={"delivery_id": row["delivery_id"]}
    )


def test_a_row_queued_before_the_upgrade_reads_as_the_same_notification() -> None:
    note = notification(CTX, POLICY, STATE, "firing", 7, NOW, Verdict(**VERDICT))
    stored = outbox_row(note, channel="slack", alert_id=7)["payload"]
    assert set(OLD_ROW) <= set(stored)  # every key an old row has is still written
    old = Notification.model_validate(OLD_ROW)
    assert old == note.model_copy(update={"delivery_id": "msg_old"})
