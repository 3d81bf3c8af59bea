"""The action webhook driver against a real HTTP receiver on loopback, its signature verified
with the ``standardwebhooks`` library; and the registry that builds every driver from settings."""

from __future__ import annotations

import base64
import logging
import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from service.actions.base import ReclaimTarget
from service.actions.kubernetes import KubernetesDriver
from service.actions.registry import action_client, check_action_webhook_url, drivers_from
from service.actions.webhook import WebhookDriver
from service.errors import ConfigError
from service.notify.urlsafety import Resolver
from service.settings import Settings
from tests.receivers import Receiver

SECRET = "whsec_" + base64.b64encode(b"action-webhook-test-key-32bytes!").decode()


def settings(**kw: object) -> Settings:
    values: dict[str, object] = {"webhook_allow_nets": "127.0.0.0/8", "action_timeout_seconds": 2.0}
    return Settings.model_validate(values | kw)


def driver_for(url: str, s: Settings | None = None, secret: str | None = SECRET) -> WebhookDriver:
    s = s or settings()
    s = s.model_copy(update={"action_webhook_url": url, "action_webhook_secret": secret})
    found = drivers_from(s)["webhook"]
    assert isinstance(found, WebhookDriver)
    return found


STEP = ReclaimTarget(
    job_id="slurm:4242",
    mode="reclaim",
    user="alice",
    team="vision",
    nodes=("gpu-07",),
    labels={"partition": "a100"},
    policy="idle-gpu-ladder",
    reason="idle-held since 10:02, warned 11:02 and 11:47",
    figures={"idle_seconds": 7200.0, "waste_usd": 5.8},
    idempotency_key="ladder-17-step-2",
)


def test_the_action_is_posted_signed_and_verifies(receiver: Receiver):
    result = driver_for(receiver.url + "/reclaim").reclaim(STEP, dry_run=False)
    assert result.outcome == "reclaimed", result
    (got,) = receiver.wait_for(1)
    assert got.path == "/reclaim"
    doc = Webhook(SECRET).verify(got.body.decode(), got.headers)  # raises unless signed
    assert doc == {
        "type": "action.reclaim",
        "timestamp": doc["timestamp"],
        "data": {
            "idempotency_key": "ladder-17-step-2",
            "job_id": "slurm:4242",
            "user": "alice",
            "team": "vision",
            "nodes": ["gpu-07"],
            "labels": {"partition": "a100"},
            "mode": "reclaim",
            "policy": "idle-gpu-ladder",
            "dry_run": False,
            "reason": "idle-held since 10:02, warned 11:02 and 11:47",
            "figures": {"idle_seconds": 7200.0, "waste_usd": 5.8},
        },
    }
    # Dated as it is sent (verification refuses a timestamp five minutes from now).
    sent_at = datetime.fromtimestamp(int(got.headers["webhook-timestamp"]), UTC)
    assert datetime.fromisoformat(doc["timestamp"]).replace(microsecond=0) == sent_at
    assert got.headers["webhook-id"] == "ladder-17-step-2"
    assert got.headers["content-type"] == "application/json"
    with pytest.raises(WebhookVerificationError):
        other = "whsec_" + base64.b64encode(b"another-key-of-thirty-two-bytes!").decode()
        Webhook(other).verify(got.body.decode(), got.headers)


def test_a_retry_of_one_step_carries_the_same_key(receiver: Receiver):
    receiver.script = [(503, {"retry-after": "30"})]
    driver = driver_for(receiver.url)
    first = driver.reclaim(STEP, dry_run=False)
    assert first.outcome == "failed"
    assert "HTTP 503" in first.detail and "Retry-After 30" in first.detail
    assert driver.reclaim(STEP, dry_run=False).outcome == "reclaimed"
    unkeyed = ReclaimTarget(job_id="slurm:4242", mode="reclaim", policy="idle-gpu-ladder")
    driver.reclaim(unkeyed, dry_run=False)
    driver.reclaim(unkeyed, dry_run=False)
    ids = [r.headers["webhook-id"] for r in receiver.wait_for(4)]
    assert ids[0] == ids[1] == "ladder-17-step-2"
    assert ids[2] == ids[3] != ids[0]  # made of the policy, job and mode when none is given


@pytest.mark.parametrize(
    ("status", "outcome", "words"),
    [
        (200, "reclaimed", "POST action.reclaim for slurm:4242"),
        (202, "reclaimed", "webhook-id ladder-17-step-2"),
        (404, "gone", "HTTP 404: the receiver has no such job"),
        (410, "gone", "HTTP 410"),
        (409, "failed", "refused the document"),
        (401, "failed", "check the secret and URL"),
        (302, "failed", "redirect (not followed)"),
        (429, "failed", "busy or unreachable"),
        (500, "failed", "server error"),
    ],
)
def test_answers_map_to_outcomes(receiver: Receiver, status: int, outcome: str, words: str):
    receiver.default_status = status
    result = driver_for(receiver.url).reclaim(STEP, dry_run=False)
    assert result.outcome == outcome, result
    assert words in result.detail
    assert receiver.url not in result.detail  # a webhook URL may itself be a secret


def test_no_answer_in_time_is_a_failure(receiver: Receiver):
    receiver.delay_seconds = 1.0
    slow = driver_for(receiver.url, settings(action_timeout_seconds=0.2))
    result = slow.reclaim(STEP, dry_run=False)
    assert result.outcome == "failed" and "timed out" in result.detail


def test_dry_run_sends_nothing(receiver: Receiver):
    result = driver_for(receiver.url).reclaim(STEP, dry_run=True)
    assert result.outcome == "would"
    assert result.detail == (
        "POST action.reclaim for slurm:4242 to the action-webhook (webhook-id ladder-17-step-2)"
    )
    assert receiver.received == []


def test_the_notifiers_url_rules_apply(receiver: Receiver):
    closed = driver_for(receiver.url, Settings(webhook_allow_nets=""))
    result = closed.reclaim(STEP, dry_run=False)
    assert result.outcome == "failed"
    assert "loopback" in result.detail and "GPUWARDEN_WEBHOOK_ALLOW_NETS" in result.detail
    unsigned = driver_for(receiver.url, secret=None)
    result = unsigned.reclaim(STEP, dry_run=False)
    assert result.outcome == "failed" and "no secret" in result.detail
    assert unsigned.reclaim(STEP, dry_run=True).outcome == "failed"
    assert receiver.received == []


def test_the_registry_builds_every_configured_driver(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    s = settings(
        kubernetes_kubeconfig=kubeconfig,
        kubernetes_context="prod",
        action_webhook_url="https://reaper.example.com/act",
        action_webhook_secret=SECRET,
    )
    client = action_client(s)
    try:
        drivers = drivers_from(s, client=client)
    finally:
        client.close()
    assert set(drivers) == {"slurm", "kubernetes", "webhook"}
    assert {name: d.name for name, d in drivers.items()} == {n: n for n in drivers}
    k8s = drivers["kubernetes"]
    assert isinstance(k8s, KubernetesDriver)
    assert (k8s.kubeconfig, k8s.context, k8s.timeout_seconds) == (kubeconfig, "prod", 2.0)
    assert set(drivers_from(Settings())) == {"slurm", "kubernetes"}  # no webhook unless set


@pytest.mark.parametrize(
    ("url", "secret", "words"),
    [
        ("ftp://reaper.example.com", SECRET, "action_webhook_url"),
        ("https://reaper.example.com", "not-a-key", "whsec_<base64>"),
        ("https://reaper.example.com", "whsec_not base64!", "must be base64"),
        ("https://reaper.example.com", None, "GPUWARDEN_ACTION_WEBHOOK_SECRET"),
    ],
)
def test_a_bad_action_webhook_setting_is_refused_with_the_setting(
    url: str, secret: str | None, words: str
):
    with pytest.raises(ValidationError, match=re.escape(words)):
        Settings(action_webhook_url=url, action_webhook_secret=secret)


def key_of(size: int) -> str:
    return "whsec_" + base64.b64encode(bytes(range(1, size + 1))).decode()


def test_an_action_webhook_secret_shorter_than_24_bytes_is_refused_naming_the_setting():
    for size in (5, 23):
        with pytest.raises(ValidationError, match="GPUWARDEN_ACTION_WEBHOOK_SECRET") as caught:
            Settings(
                action_webhook_url="https://reaper.example.com", action_webhook_secret=key_of(size)
            )
        assert f"decodes to {size} bytes" in str(caught.value) and "at least 24" in str(
            caught.value
        )
    for size in (24, 64):
        s = Settings(
            action_webhook_url="https://reaper.example.com", action_webhook_secret=key_of(size)
        )
        assert s.action_webhook_secret == key_of(size)


def resolver_to(*addresses: str) -> Resolver:
    """A resolver that answers ``addresses`` for any host."""
    return lambda host, port: list(addresses)


@pytest.mark.parametrize(
    ("url", "addresses", "why"),
    [
        ("http://169.254.169.254/latest/meta-data", (), "link-local"),
        ("http://127.0.0.1:9/reclaim", (), "loopback"),
        ("https://reaper.internal/act", ("10.0.0.5",), "private"),
        ("https://reaper.example.com/act", ("93.184.216.34", "127.0.0.1"), "loopback"),
    ],
)
def test_an_action_webhook_url_at_a_refused_address_stops_the_start(
    url: str, addresses: tuple[str, ...], why: str
):
    s = settings(webhook_allow_nets="", action_webhook_url=url, action_webhook_secret=SECRET)
    with pytest.raises(ConfigError) as caught:
        check_action_webhook_url(s, resolver=resolver_to(*addresses))
    message = str(caught.value)
    assert message.startswith("GPUWARDEN_ACTION_WEBHOOK_URL: ") and why in message, message
    assert "GPUWARDEN_WEBHOOK_ALLOW_NETS" in message


def test_an_action_webhook_url_starts_where_the_allow_list_admits_it_or_dns_is_not_up(
    caplog: pytest.LogCaptureFixture,
):
    admitted = settings(
        action_webhook_url="http://127.0.0.1:9/reclaim", action_webhook_secret=SECRET
    )
    check_action_webhook_url(admitted)  # 127.0.0.0/8 is admitted: no error
    public = settings(webhook_allow_nets="", action_webhook_url="https://reaper.example.com/act",
                      action_webhook_secret=SECRET)  # fmt: skip
    check_action_webhook_url(public, resolver=resolver_to("93.184.216.34"))
    with caplog.at_level(logging.WARNING, logger="service.actions.registry"):
        check_action_webhook_url(public, resolver=resolver_to())  # no address yet: warned only
    assert any("does not resolve" in m for m in caplog.messages)
    check_action_webhook_url(settings())  # no action webhook: nothing to check


def test_serve_with_an_action_webhook_at_the_metadata_address_refuses_in_one_line(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    env |= {
        "GPUWARDEN_DATABASE_URL": f"sqlite:///{tmp_path / 'gw.db'}",
        "GPUWARDEN_ACTION_WEBHOOK_URL": "http://169.254.169.254/latest/meta-data",
        "GPUWARDEN_ACTION_WEBHOOK_SECRET": SECRET,
    }
    r = subprocess.run([sys.executable, "-m", "service.cli", "serve", "--port", "1"], env=env,
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert "GPUWARDEN_ACTION_WEBHOOK_URL" in r.stderr and "GPUWARDEN_WEBHOOK_ALLOW_NETS" in r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    env["GPUWARDEN_ACTION_WEBHOOK_SECRET"] = key_of(5)
    r = subprocess.run([sys.executable, "-m", "service.cli", "serve", "--port", "1"], env=env,
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "GPUWARDEN_ACTION_WEBHOOK_SECRET" in r.stderr, r.stderr
