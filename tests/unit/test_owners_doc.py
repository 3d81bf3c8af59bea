"""docs/actions.md's owners section stays true: the directory and channels parse, and the sample
notice is what the renderer writes for those figures."""

from __future__ import annotations

from datetime import UTC, datetime

import yaml

from service.core.verdict import Verdict
from service.notify.message import OwnerNotice, render_owner_notice
from service.thresholds.owners import parse_owners_section
from service.thresholds.policy import parse_channel
from tests.support import doc_block


def block(after_heading: str, lang: str) -> str:
    """The first ``lang`` code block after the heading in docs/actions.md."""
    return doc_block("actions.md", after_heading, lang)


def test_the_directory_and_channels_shown_are_valid() -> None:
    owners = parse_owners_section(yaml.safe_load(block("### The directory", "yaml"))["owners"])
    assert [o.key for o in owners] == ["admins", "team:vision", "user:alice"]
    channels = yaml.safe_load(block("### E-mail and Slack DM channels", "yaml"))["channels"]
    assert [parse_channel(c).type for c in channels] == ["email", "email", "slack_dm"]


def test_the_sample_notice_is_the_rendered_one() -> None:
    notice = OwnerNotice(
        job_id="slurm:123", user="alice", team="vision", policy="idle-held-job",
        description="Nothing runs on the job's GPUs while they hold memory.",
        node="gpu-node-07", gpus="0 (GPU-5f3c1a2b)", since=datetime(2026, 12, 4, 10, 2, tzinfo=UTC),
        seen="min idle_held over 5m = 1 (>= 1)",
        verdict=Verdict(
            top_cause="idle_held", cost_usd=12.40, waste_usd=12.40, idle_usd=12.40,
            fixable_usd=0.0,
            fix="end the idle process or add an idle timeout, so the GPU is released",
            fix_saving_usd=12.40,
        ),
        next_step="GPU Warden will warn",
        next_step_at=datetime(2026, 12, 4, 11, 47, tzinfo=UTC),
        report_url="https://warden.example.org/jobs/slurm%3A123",
        action="This is warning 1 of the 3 steps GPU Warden takes on such jobs.",
    )  # fmt: skip
    msg = render_owner_notice(notice)
    shown = block("### A notice as it arrives", "")
    headers, _, body = shown.partition("\n\n")
    assert f"Subject: {msg.subject}" in headers
    assert body.strip() == msg.text.strip()
    assert msg.slack_blocks[0]["text"]["text"] in block("### A notice as it arrives", "json")
