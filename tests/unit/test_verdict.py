"""An alert's verdict is one type with one name per figure: notifications, owner notices and
reclaim targets carry it, and stored notifications keep its figures as flat keys."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from service.actions.base import ReclaimTarget
from service.actions.webhook import action_document
from service.core.verdict import FIELDS, Verdict
from service.notify import Notification
from service.notify.message import OwnerNotice, owner_notice_of, render_owner_notice
from tests.support import job_alert

AT = datetime(2026, 12, 4, 10, 2, tzinfo=UTC)
FULL = Verdict(
    waste_usd=3.0,
    cost_usd=4.0,
    idle_usd=2.0,
    fixable_usd=1.0,
    top_cause="launch_bound",
    fix="CUDA graphs",
    fix_saving_usd=0.67,
)
ALERT = job_alert(active_since=AT, report_url="https://warden.example/jobs/slurm%3A7")


def test_the_stored_json_holds_every_figure_as_a_flat_key_and_reads_back() -> None:
    note = Notification.model_validate(ALERT | {"verdict": FULL})
    stored = note.model_dump(mode="json")
    assert "verdict" not in stored  # rows already in the outbox have the figures flat
    assert {k: stored[k] for k in FIELDS} == FULL.model_dump()
    assert Notification.model_validate(stored) == note


def test_a_row_without_figures_has_no_verdict() -> None:
    note = Notification.model_validate(ALERT)
    assert note.verdict == Verdict() and note.verdict.amounts() == {}
    assert note.verdict.waste_words() is None and note.verdict.cause_words() is None


def test_the_owner_notice_carries_the_alerts_verdict_and_says_each_figure() -> None:
    note = Notification.model_validate(ALERT | {"verdict": FULL})
    notice = owner_notice_of(note, next_step="GPU Warden will warn", next_step_at=AT)
    assert notice.verdict is note.verdict and notice.report_url == note.report_url
    text = render_owner_notice(notice).text
    for said in (
        "Cause: launch_bound",
        "cost so far $4.00",
        "waste so far $3.00 (idle $2.00 + fixable $1.00, estimated)",
        "Fix: CUDA graphs (saves about $0.67)",
        "Next: GPU Warden will warn at 2026-12-04T10:02:00Z",
        "The job's page: https://warden.example/jobs/slurm%3A7",
    ):
        assert said in text


def test_an_owner_notice_refuses_a_figure_under_an_old_name() -> None:
    # cause, next_at and job_url were the old names of top_cause, next_step_at and report_url.
    with pytest.raises(ValidationError, match="cause"):
        OwnerNotice.model_validate(
            {"job_id": "slurm:7", "policy": "p", "since": AT, "seen": "s", "cause": "idle_held"}
        )


def test_a_reclaim_sends_the_verdicts_dollars_beside_its_own_figures() -> None:
    target = ReclaimTarget(
        job_id="slurm:7",
        mode="reclaim",
        figures={"condition_seconds": 720.0},
        verdict=Verdict(waste_usd=3.0, idle_usd=2.0, top_cause="idle_held"),
    )
    data = action_document(target, key="ladder-1-0-step-2", now=AT)["data"]
    # Only known numbers: no null, and the cause (a word) is the notice's, not a figure.
    assert data["figures"] == {"condition_seconds": 720.0, "waste_usd": 3.0, "idle_usd": 2.0}
