"""Pure notifier helpers: URL safety, rate limit, message rendering (the table: test_delivery_table)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from standardwebhooks.webhooks import Webhook

from service.core import slack_text
from service.errors import ValidationFailed
from service.notify import Notification, alertmanager, slack, webhook
from service.notify.ratelimit import RateLimiter
from service.notify.urlsafety import parse_allow_nets, resolve_checked
from service.vocabulary import ALERT_LABELS

T0 = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)


def resolver_to(*addrs: str):
    return lambda host, port: list(addrs)


@pytest.mark.parametrize(
    ("url", "addrs", "why"),
    [
        ("http://127.0.0.1:8080/x", (), "loopback"),
        ("http://169.254.169.254/latest/meta-data", (), "link-local"),
        ("http://10.1.2.3/", (), "private"),
        ("http://[::1]/", (), "loopback"),
        ("http://[::ffff:127.0.0.1]/", (), "loopback"),
        ("http://internal.example/", ("192.168.1.5",), "private"),
        ("http://mixed.example/", ("93.184.216.34", "10.0.0.1"), "private"),
        ("http://0.0.0.0/", (), "reserved"),
    ],
)
def test_private_destinations_are_refused(url: str, addrs: tuple[str, ...], why: str) -> None:
    with pytest.raises(ValidationFailed) as err:
        resolve_checked(url, [], resolver=resolver_to(*addrs))
    assert err.value.field == "url" and why in err.value.message


def test_public_and_allow_listed_destinations_pass() -> None:
    resolve_checked("https://hooks.example/x", [], resolver=resolver_to("93.184.216.34"))
    nets = parse_allow_nets("127.0.0.0/8, 10.0.0.0/8")
    resolve_checked("http://127.0.0.1:9/x", nets)
    resolve_checked("http://svc.internal/", nets, resolver=resolver_to("10.2.3.4"))
    with pytest.raises(ValidationFailed):
        resolve_checked("http://169.254.169.254/", nets)
    with pytest.raises(ValidationFailed) as err:
        resolve_checked("http://user:pw@hooks.example/", [], resolver=resolver_to("93.184.216.34"))
    assert "pw" not in str(err.value)
    with pytest.raises(ValidationFailed) as err:
        parse_allow_nets("10.0.0.0/8,nonsense")
    assert err.value.field == "webhook_allow_nets"


def test_rate_limiter_spaces_messages_per_channel() -> None:
    lim = RateLimiter()
    assert lim.wait_seconds("slack", 1.0, 100.0) == 0
    lim.take("slack", 100.0)
    assert lim.wait_seconds("slack", 1.0, 100.2) == pytest.approx(0.8)
    assert lim.wait_seconds("other", 1.0, 100.2) == 0  # per channel
    assert lim.wait_seconds("slack", 1.0, 101.0) == 0


# The labels every sender puts on note(): the scope's, then policy and severity.
NOTE_LABELS = {
    "job_id": "slurm:42",
    "user": "alice",
    "team": "ml",
    "node": "n1",
    "gpu_uuid": "GPU-a",
    "gpu_index": "0",
    "policy": "low-sm-activity",
    "severity": "warning",
}


def note(**kw: object) -> Notification:
    doc: dict[str, object] = {
        "delivery_id": "msg_1",
        "kind": "firing",
        "status": "firing",
        "policy": "low-sm-activity",
        "severity": "warning",
        "metric": "sm_active",
        "aggregate": "avg",
        "window": "10m",
        "op": "<",
        "threshold": 0.3,
        "value": 0.12,
        "scope": "job",
        "scope_key": "job:slurm:42",
        "labels": {
            "job_id": "slurm:42",
            "user": "alice",
            "team": "ml",
            "node": "n1",
            "gpu_uuid": "GPU-a",
            "gpu_index": "0",
        },
        "active_since": T0,
        "fired_at": T0,
        "waste_usd": 12.5,
        "report_url": "http://gw/api/v1/jobs/slurm:42",
    }
    return Notification.model_validate(doc | kw)


def test_slack_message_has_text_blocks_and_stays_within_limits() -> None:
    msg = slack.render(
        note(labels={"job_id": "j" * 5000, "node": "<" * 5000}, description="&" * 9000)
    )
    assert msg["text"] and len(msg["text"]) <= slack_text.TEXT_MAX
    assert len(msg["blocks"]) <= 50
    header = msg["blocks"][0]
    assert header["type"] == "header" and len(header["text"]["text"]) <= 150
    for b in msg["blocks"]:
        if "text" in b and b["type"] == "section":
            assert len(b["text"]["text"]) <= 3000
        for f in b.get("fields", []):
            assert len(f["text"]) <= 2000
        assert len(b.get("fields", [])) <= 10
    full = json.dumps(slack.render(note()))
    for needle in (
        "low-sm-activity",
        "slurm:42",
        "alice",
        "ml",
        "0.12",
        "&lt; 0.3",
        "$12.50",
        "http://gw/api/v1/jobs/slurm:42",
        "2026-12-02T08:00:00Z",
    ):
        assert needle in full, needle


def test_webhook_signature_verifies_with_standard_webhooks() -> None:
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = json.dumps(webhook.render(note())).encode()
    headers = webhook.signature_headers(secret, "msg_1", datetime.now(UTC), body)
    assert headers["webhook-signature"].startswith("v1,")
    payload = Webhook(secret).verify(body, headers)["data"]
    assert payload["policy"] == "low-sm-activity" and payload["state"] == "firing"
    assert payload["labels"] == NOTE_LABELS
    tampered = body.replace(b"firing", b"resolved")
    with pytest.raises(Exception, match="signature"):
        Webhook(secret).verify(tampered, headers)


def test_alertmanager_body_shape() -> None:
    (a,) = alertmanager.render(note(ends_at=datetime(2026, 12, 2, 8, 4, tzinfo=UTC)))
    assert a["labels"]["alertname"] == "low-sm-activity"
    assert a["labels"] == {"alertname": "low-sm-activity", **NOTE_LABELS}
    assert a["startsAt"] == "2026-12-02T08:00:00Z" and a["endsAt"] == "2026-12-02T08:04:00Z"
    assert a["annotations"]["waste_usd"] == "12.50"
    resolved_at = datetime(2026, 12, 2, 8, 9, tzinfo=UTC)
    (r,) = alertmanager.render(note(status="resolved", kind="resolved", resolved_at=resolved_at))
    assert r["endsAt"] == "2026-12-02T08:09:00Z"


def test_every_sender_speaks_the_one_label_vocabulary() -> None:
    # A delivery queued by an older version still says job and gpu; it leaves in the new names.
    old = note(labels={"job": "slurm:7", "gpu": "GPU-b", "node": "n2"})
    assert old.headline() == "[FIRING] low-sm-activity on job slurm:7"
    (a,) = alertmanager.render(old)
    body = webhook.render(old)["data"]
    fields = [f["text"] for b in slack.render(old)["blocks"] for f in b.get("fields", [])]
    for labels in (a["labels"], body["labels"]):
        assert set(labels) - {"alertname"} <= set(ALERT_LABELS)
        assert labels["job_id"] == "slurm:7" and labels["gpu_uuid"] == "GPU-b"
        assert "job" not in labels and "gpu" not in labels
    assert "*job_id*\nslurm:7" in fields and "*gpu_uuid*\nGPU-b" in fields


def test_slack_escapes_what_mrkdwn_would_read_as_mentions_or_links() -> None:
    msg = slack.render(
        note(
            labels={"job_id": "<!channel>", "user": "a&b"},
            description="ratio (< 2) then a later > sign; <https://evil.example|click>",
        )
    )
    # The header is plain_text, which Slack never parses; everything else is mrkdwn.
    assert msg["blocks"][0]["text"]["type"] == "plain_text"
    full = json.dumps({"text": msg["text"], "blocks": msg["blocks"][1:]})
    assert "<!channel>" not in full and "&lt;!channel&gt;" in full
    assert "a&amp;b" in full
    assert "(&lt; 2) then a later &gt; sign" in full
    assert "<https://evil.example" not in full
    # Our own link stays a link; the header is plain_text, which Slack never parses.
    assert "<http://gw/api/v1/jobs/slurm:42|Job report>" in full


def test_slack_cut_never_splits_an_entity() -> None:
    msg = slack.render(note(description="<" * 4000))
    section = msg["blocks"][1]["text"]["text"]
    assert len(section) <= slack_text.SECTION_MAX
    assert section.endswith("&lt;…")
