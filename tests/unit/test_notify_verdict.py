"""Job alerts carry the verdict: the waste as idle + fixable, the top cause, its fix and saving."""

from __future__ import annotations

from service.notify import alertmanager, slack, webhook
from service.notify.base import Notification
from tests.support import job_alert


def note(**verdict: object) -> Notification:
    return Notification.model_validate(job_alert(**verdict))


VERDICT = {
    "waste_usd": 3.0,
    "idle_usd": 2.0,
    "fixable_usd": 1.0,
    "top_cause": "launch_bound",
    "fix": "launch fewer, larger kernels: CUDA graphs",
    "fix_saving_usd": 0.67,
}
WASTE = "waste so far $3.00 (idle $2.00 + fixable $1.00, estimated)"


def test_slack_webhook_and_alertmanager_say_the_waste_the_cause_and_the_fix() -> None:
    line = "top cause: launch_bound; fix: launch fewer, larger kernels: CUDA graphs "
    line += "(saves about $0.67)"
    assert note(**VERDICT).verdict.cause_words() == line
    assert note(**VERDICT).verdict.waste_words() == WASTE
    section = slack.render(note(**VERDICT))["blocks"][1]["text"]["text"]
    assert line in section and WASTE in section
    body = webhook.render(note(**VERDICT))["data"]
    assert body["top_cause"] == "launch_bound" and body["fix_saving_usd"] == 0.67
    assert (body["waste_usd"], body["idle_usd"], body["fixable_usd"]) == (3.0, 2.0, 1.0)
    assert body["summary"].endswith(f"{WASTE}; {line}")
    annotations = alertmanager.render(note(**VERDICT))[0]["annotations"]
    assert annotations["waste_usd"] == "3.00" and annotations["top_cause"] == "launch_bound"
    assert (annotations["idle_usd"], annotations["fixable_usd"]) == ("2.00", "1.00")
    for old in ("wasted_usd", "dominant_cause", "dominant_cause_usd"):
        assert old not in body and old not in annotations


def test_without_a_verdict_nothing_is_said() -> None:
    plain = note()
    assert plain.verdict.cause_words() is None and plain.verdict.waste_words() is None
    assert "top cause" not in str(slack.render(plain))
    assert webhook.render(plain)["data"]["top_cause"] is None


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
