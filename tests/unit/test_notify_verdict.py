"""Job alerts carry the verdict: the dominant cause, its dollars, the fix and its saving."""

from __future__ import annotations

from datetime import UTC, datetime

from service.thresholds.notify import slack, webhook
from service.thresholds.notify.base import Notification


def note(**verdict: object) -> Notification:
    return Notification.model_validate(
        {
            "delivery_id": "msg_1",
            "kind": "firing",
            "status": "firing",
            "policy": "launch-bound-job",
            "severity": "warning",
            "metric": "cause:launch_bound",
            "aggregate": "avg",
            "window": "30m",
            "op": ">",
            "threshold": 0.5,
            "value": 0.8,
            "scope": "job",
            "scope_key": "slurm:7",
            "labels": {"job_id": "slurm:7"},
            "active_since": datetime(2026, 12, 3, 8, tzinfo=UTC),
            "wasted_usd": 2.4,
            **verdict,
        }
    )


VERDICT = {
    "dominant_cause": "launch_bound",
    "dominant_cause_usd": 1.33,
    "fix": "launch fewer, larger kernels: CUDA graphs",
    "fix_saving_usd": 0.67,
}


def test_slack_and_webhook_name_the_cause_its_dollars_and_the_fix() -> None:
    line = "most waste: launch_bound ($1.33); fix: launch fewer, larger kernels: CUDA graphs "
    line += "(saves about $0.67)"
    assert note(**VERDICT).verdict() == line
    section = slack.render(note(**VERDICT))["blocks"][1]["text"]["text"]
    assert line in section
    body = webhook.render(note(**VERDICT))["data"]
    assert body["dominant_cause"] == "launch_bound" and body["fix_saving_usd"] == 0.67
    assert body["summary"].endswith(line)


def test_without_a_verdict_nothing_is_said() -> None:
    plain = note()
    assert plain.verdict() is None
    assert "most waste" not in str(slack.render(plain))
    assert webhook.render(plain)["data"]["dominant_cause"] is None


def test_a_gpu_alert_names_node_and_index_and_a_fault_its_xid() -> None:
    fault = note(
        policy="gpu-hardware-fault",
        metric="hardware_fault",
        aggregate="max",
        window="5m",
        op=">=",
        threshold=1,
        value=1,
        scope="gpu",
        scope_key="gpu:GPU-a3",
        labels={"gpu_uuid": "GPU-a3", "node": "node-a", "gpu_index": "3"},
        xid_code=79,
    )
    assert fault.headline() == "[FIRING] gpu-hardware-fault on node-a GPU 3 (GPU-a3)"
    assert fault.condition().endswith("; XID 79 (GPU has fallen off the bus)")
    body = webhook.render(fault)
    assert body["data"]["xid_code"] == 79 and "node-a GPU 3" in body["data"]["summary"]
    assert "XID 79" in str(slack.render(fault))
    counters = note(scope="gpu", labels={"gpu_uuid": "GPU-a3"})  # no node/index, no XID
    assert counters.headline() == "[FIRING] launch-bound-job on gpu GPU-a3"
    assert "XID" not in counters.condition()
