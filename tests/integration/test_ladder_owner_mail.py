"""A ladder addressed to ``owner``: each step mails the job's owner (a dry run: the admins) what
was seen, the dollars, what was done and what comes next and when, once per step."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import Engine

from service.db import notices_repo, owners_repo, policies_repo
from service.thresholds.owners import OwnerEntry
from service.thresholds.policy import parse_channel, parse_policy
from service.usecases.notices import DRY_RUN_REASON
from tests.alerting_support import add_job
from tests.ladder_support import IDLE_HELD, STEPS, LadderWorld, RecordingDriver, idle_policy
from tests.receivers import Receiver
from tests.smtp_support import SmtpServer
from tests.support import FakeClock

JOB = "slurm:5150"


def _world(app: Any, engine: Engine, clock: FakeClock, smtp: SmtpServer, *, dry_run: bool,
           receiver: Receiver) -> LadderWorld:  # fmt: skip
    ctx = app.state.ctx
    smtp.send_here(ctx.settings)
    w = LadderWorld(ctx, engine, clock, receiver, {"slurm": RecordingDriver()})
    w.samples(1, IDLE_HELD)
    policy = idle_policy({"steps": STEPS, "dry_run": dry_run}, channels=["owner"])
    with engine.begin() as conn:
        mail = parse_channel({"name": "mail", "type": "email"})
        policies_repo.put_channel(conn, channel=mail, source="api", now=clock())
        policies_repo.put_policy(conn, policy=parse_policy(policy), source="api", now=clock())
        for entry in (
            OwnerEntry(kind="user", name="alice", email="alice@example.org"),
            OwnerEntry(kind="admins", name="admins", email="gpu-admins@example.org"),
        ):
            owners_repo.put_owner(conn, entry=entry, source="api", now=clock())
    add_job(engine, JOB, w.gpus, started_at=clock() - timedelta(minutes=1))
    return w


def test_each_step_mails_the_owner_once_with_what_comes_next(
    app: Any, engine: Engine, clock: FakeClock, smtp: SmtpServer, receiver: Receiver
) -> None:
    w = _world(app, engine, clock, smtp, dry_run=False, receiver=receiver)
    w.idle_for(6)
    assert w.actions(JOB) == [("notify_owner", "warned")]
    (first,) = smtp.received
    assert first.message["To"] == "alice@example.org" and JOB in first.message["Subject"]
    text = first.part("plain")
    assert "This is warning 1 of the 3 steps" in text
    assert "Next: GPU Warden will warn at 20" in text
    assert "Dollars: cost so far $" in text and "waste so far $" in text
    w.idle_for(10)
    assert w.actions(JOB) == [
        ("notify_owner", "warned"), ("notify_owner", "warned"), ("reclaim", "reclaimed"),
    ]  # fmt: skip
    assert len(smtp.received) == 3
    assert "Next: GPU Warden will cancel at 20" in smtp.received[1].part("plain")
    last = smtp.received[2].part("plain")
    assert "GPU Warden reclaimed the job (cancel)." in last
    with engine.connect() as conn:
        rows = notices_repo.list_notices(conn, job_id=JOB)
    assert [(r["status"], r["recipient"], r["fallback"]) for r in rows] == [
        ("sent", "user:alice", None)
    ] * 3
    w.idle_for(2)
    assert len(smtp.received) == 3  # nothing more once the ladder is done


def test_a_dry_run_mails_the_admins_what_it_would_do(
    app: Any, engine: Engine, clock: FakeClock, smtp: SmtpServer, receiver: Receiver
) -> None:
    w = _world(app, engine, clock, smtp, dry_run=True, receiver=receiver)
    w.idle_for(16)
    assert [o for _, o in w.actions(JOB)] == ["would", "would", "would"]
    assert {m.message["To"] for m in smtp.received} == {"gpu-admins@example.org"}
    assert all(m.message["Subject"].startswith("[dry run] ") for m in smtp.received)
    assert "GPU Warden would cancel now; nothing was done." in smtp.received[2].part("plain")
    with engine.connect() as conn:
        rows = notices_repo.list_notices(conn, job_id=JOB)
    assert {(r["asked"], r["recipient"], r["fallback"], r["reason"]) for r in rows} == {
        ("user:alice", "admins", "admins", DRY_RUN_REASON)
    }
