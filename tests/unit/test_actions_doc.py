"""docs/actions.md's Kubernetes and action webhook examples stay true: the policy parses with its
ladder, and the action document shown has the fields the driver sends."""

from __future__ import annotations

import json

import yaml

from service.actions.base import ReclaimTarget
from service.actions.webhook import action_document
from service.thresholds.policy import parse_config
from tests.support import FakeClock, doc_block


def block(after_heading: str, lang: str) -> str:
    """The first ``lang`` code block after the heading in docs/actions.md."""
    return doc_block("actions.md", after_heading, lang)


def test_the_kubernetes_example_policy_is_valid():
    text = block("### A worked example: idle notebooks", "yaml")
    config = yaml.safe_load(text.replace("${SLACK_WEBHOOK_URL}", "https://hooks.slack.com/x"))
    (policy,), _ = parse_config(config)
    assert policy.ladder is not None
    assert policy.ladder.dry_run is True
    assert policy.ladder.reclaim.kubernetes == "scale_to_zero"
    assert [s.action for s in policy.ladder.steps] == ["notify_owner", "notify_owner", "reclaim"]
    assert policy.ladder.exempt.namespaces == ["inference"]


def test_the_action_document_shown_is_the_one_sent():
    shown = json.loads(block("## The action webhook", "json"))
    sent = action_document(ReclaimTarget("batch:1", "reclaim"), key="k", now=FakeClock()())
    assert shown.keys() == sent.keys()
    assert shown["data"].keys() == sent["data"].keys()
    assert shown["type"] == sent["type"]
