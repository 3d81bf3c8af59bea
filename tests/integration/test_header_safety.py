"""Inputs that cannot reach a header (issue 45, part 5), on both stores: a job id with CR/LF or
off the scheduler's spelling is a 422 naming ``id`` and stores nothing; names and labels with
control characters likewise; the agent wire refuses them in hints and labels, and clears a
non-canonical hint without losing a sample; a mail already queued with CR/LF in its subject is
failed at once with its reason (no retry, no mail); a notifier that raises unexpectedly is set
aside as failed after a bounded number of tries, its traceback logged once; a normal owner mail
still arrives through a real SMTP server."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from sqlalchemy import Engine, func, select

from service.collectors.attribution import job_from_environ
from service.db import outbox_repo
from service.db.schema import gpu_processes, jobs, notices, outbox, samples
from service.errors import ValidationFailed
from service.notify.base import Notification
from service.notify.email import EmailNotifier
from service.notify.envelope import Message
from service.notify.webhook import WebhookNotifier
from service.thresholds.owners import Addressee, OwnerEntry
from service.thresholds.policy import ChannelSpec
from service.usecases import notices as notices_usecase
from service.usecases.evaluation import evaluate_once
from service.usecases.outbox import INTERNAL_ERROR_ATTEMPTS, Dispatcher
from service.usecases.upkeep import rollup_once
from tests.alerting_support import add_job, add_price, auth, ingest, low_sm_policy
from tests.receivers import Receiver
from tests.smtp_support import SmtpServer
from tests.support import FakeClock, iso, make_batch

INJECTED = "slurm:1\r\nBcc: mallory@evil.example"
BUSY = {"sm_active": 0.5}
IDLE = {"sm_active": 0.0, "gpu_util": 0.0, "fb_used_bytes": 20 * 2**30}
ALICE = OwnerEntry(kind="user", name="alice", email="alice@example.org")


@pytest.fixture
def ctx(app: Any, smtp: SmtpServer) -> Any:
    ctx = app.state.ctx
    smtp.send_here(ctx.settings)
    ctx.settings.public_url = "https://warden.example"
    return ctx


def _count(engine: Engine, table: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def _outbox_row(engine: Engine, delivery_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            select(outbox.c.status, outbox.c.attempts, outbox.c.last_error).where(
                outbox.c.delivery_id == delivery_id
            )
        ).one()


def _notice(engine: Engine, delivery_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            select(notices.c.status, notices.c.error).where(notices.c.delivery_id == delivery_id)
        ).one()


def _queue_mail(ctx: Any, subject: str) -> str:
    """Queue a message to alice through the e-mail channel ``mail``; its delivery id."""
    msg = Message(subject=subject, text="t", html="<p>t</p>", slack_text="t")
    with ctx.engine.begin() as conn:
        (queued,) = notices_usecase.queue_message(
            conn, ctx, addressee=Addressee(ALICE.key, ALICE), message=msg, kind="report"
        )
    return str(queued["delivery_id"])


def _mail_channel(http: httpx.Client, admin: dict[str, str]) -> None:
    r = http.post("/api/v1/channels", json={"name": "mail", "type": "email"}, headers=admin)
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    ("job_id", "said"),
    [
        (INJECTED, "control characters (found U+000D)"),
        ("ray:a\u2028b", "control characters (found U+2028)"),
        ("slurm:0101", "is not a Slurm job id as squeue prints it"),
        ("k8s:kube-system/..", "DNS-1123"),
        ("k8s:ml/.", "DNS-1123"),
    ],
    ids=["cr-lf", "line-separator", "leading-zero", "dot-dot", "dot"],
)
def test_a_job_id_with_control_characters_or_off_the_schedulers_spelling_is_refused(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock,
    job_id: str, said: str,
) -> None:  # fmt: skip
    ingest(http, tokens["agent"], start=clock() - timedelta(minutes=1), count=1, metrics=BUSY)
    body = {"id": job_id, "user": "alice", "gpus": ["GPU-a0"], "started_at": iso(clock())}
    for token in (tokens["agent"], tokens["admin"]):
        r = http.post("/api/v1/jobs", json=body, headers=auth(token))
        assert r.status_code == 422, r.text
        (error,) = r.json()["detail"]
        assert error["loc"] == ["body", "id"] and said in error["msg"], error
    assert _count(engine, jobs) == 0
    # Looking the id up (a path parameter) is a plain 404, whatever it holds.
    got = http.get("/api/v1/jobs/" + quote(job_id, safe=""), headers=auth(tokens["reader"]))
    assert got.status_code == 404, got.text
    listed = http.get("/api/v1/jobs", params={"user": job_id}, headers=auth(tokens["reader"]))
    assert listed.status_code == 200 and listed.json() == []


@pytest.mark.parametrize(
    ("field", "value", "loc"),
    [
        ("user", "alice\nBcc: x@y", ["body", "user"]),
        ("team", "ml\r", ["body", "team"]),
        ("project", "llm\x1b[31m", ["body", "project"]),
        ("labels", {"queue\n": "a"}, ["body", "labels", "queue\n", "[key]"]),
        ("labels", {"queue": "a\x85b"}, ["body", "labels", "queue"]),
    ],
    ids=["user", "team", "project", "label-key", "label-value"],
)
def test_names_and_labels_with_control_characters_are_refused_on_create_and_update(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock,
    field: str, value: Any, loc: list[Any],
) -> None:  # fmt: skip
    admin = auth(tokens["admin"])
    ingest(http, tokens["agent"], start=clock() - timedelta(minutes=1), count=1, metrics=BUSY)
    body = {"id": "slurm:42", "user": "alice", "gpus": ["GPU-a0"], "started_at": iso(clock())}
    r = http.post("/api/v1/jobs", json=body | {field: value}, headers=admin)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == loc, r.text
    assert _count(engine, jobs) == 0
    assert http.post("/api/v1/jobs", json=body, headers=admin).status_code == 201
    r = http.patch("/api/v1/jobs/slurm:42", json={field: value}, headers=admin)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == loc, r.text
    stored = http.get("/api/v1/jobs/slurm:42", headers=admin).json()
    assert (stored["user"], stored["team"], stored["project"], stored["labels"]) == (
        "alice", None, None, {}
    )  # fmt: skip


def _with_process(batch: dict[str, Any], **process: Any) -> dict[str, Any]:
    sample = batch["samples"][0]
    return batch | {
        "processes": [{"gpu_uuid": sample["gpu_uuid"], "ts": sample["ts"], "pid": 4242} | process]
    }


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"job_id": "slurm:7\r\nBcc: x@y"}, ["body", "processes", 0, "job_id"]),
        ({"user": "alice\n"}, ["body", "processes", 0, "user"]),
    ],
    ids=["job_id", "user"],
)
def test_the_wire_refuses_control_characters_in_hints_naming_the_field(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock,
    change: dict[str, str], loc: list[Any],
) -> None:  # fmt: skip
    batch = _with_process(make_batch(start=clock() - timedelta(seconds=30)), **change)
    r = http.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"]))
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == loc, r.text
    labelled = make_batch(start=clock() - timedelta(seconds=30))
    labelled["node"]["labels"] = {"rack": "r1\r\nX: y"}
    r = http.post("/api/v1/ingest", json=labelled, headers=auth(tokens["agent"]))
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "node", "labels", "rack"], r.text
    assert _count(engine, samples) == 0 and _count(engine, jobs) == 0


def test_a_non_canonical_hint_is_cleared_and_logged_and_no_sample_is_lost(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    batch = make_batch(start=clock() - timedelta(seconds=30), count=3)
    batch = _with_process(batch, job_id="slurm:0101", user="mallory")
    with caplog.at_level(logging.WARNING, logger="service.usecases.ingest"):
        r = http.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"]))
    assert r.status_code == 200, r.text
    assert r.json()["samples_stored"] == 3 and r.json()["processes_received"] == 1
    assert _count(engine, samples) == 3
    with engine.connect() as conn:
        stored = conn.execute(select(gpu_processes.c.pid, gpu_processes.c.job_id)).all()
    assert [tuple(p) for p in stored] == [(4242, None)]  # the process stays, its hint does not
    assert _count(engine, jobs) == 0  # no observed job slurm:0101 (Slurm would read job 101)
    (line,) = [r.getMessage() for r in caplog.records if "job hints left off" in r.getMessage()]
    assert "node-a" in line and "'0101'" in line and "without leading zeros" in line


def test_the_agent_drops_environment_hints_with_control_characters() -> None:
    env = b"SLURM_JOB_ID=7\r\nBcc: x@y\0SLURM_JOB_USER=alice\nX\0"
    assert job_from_environ(env) == (None, None)  # its batches would all be refused else
    assert job_from_environ(b"SLURM_JOB_ID=7\0SLURM_JOB_USER=alice\0") == ("slurm:7", "alice")


def test_a_queued_mail_with_cr_lf_in_its_subject_fails_at_once_with_its_reason(
    ctx: Any, http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock,
    smtp: SmtpServer, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """A job stored before ids were checked (straight into the table) with CR/LF in its id: its
    owner notice cannot be mailed; it fails on the first drain, is never retried, sends no mail
    to anyone (no Bcc got through) and logs no traceback."""
    admin = auth(tokens["admin"])
    _mail_channel(http, admin)
    r = http.post("/api/v1/policies", json=low_sm_policy(["owner"], window="10m"), headers=admin)
    assert r.status_code == 201, r.text
    r = http.post("/api/v1/owners", json={"kind": "user", "name": "alice",
                                          "email": "alice@example.org"}, headers=admin)  # fmt: skip
    assert r.status_code == 201, r.text
    start = clock() - timedelta(minutes=20)
    ingest(http, tokens["agent"], start=start, count=120, gpu_uuids=("GPU-a0",), metrics=IDLE)
    add_price(engine, "*", 3.0, start)
    add_job(engine, INJECTED, ("GPU-a0",), started_at=start, user="alice")
    rollup_once(ctx)
    evaluate_once(ctx)
    with engine.connect() as conn:
        (delivery_id,) = conn.execute(select(notices.c.delivery_id)).scalars().all()
    dispatcher = Dispatcher(ctx)
    with caplog.at_level(logging.WARNING):
        assert dispatcher.drain() == 0
    status, attempts, error = _outbox_row(engine, delivery_id)
    assert (status, attempts) == ("failed", 1)
    assert error.startswith("header Subject: must not contain control characters (found U+000D)")
    assert tuple(_notice(engine, delivery_id)) == ("failed", error)
    assert smtp.attempts == 0 and smtp.received == []
    assert not [r for r in caplog.records if r.exc_info], "a dead letter is no internal error"
    clock.advance(3600)
    assert dispatcher.drain() == 0
    assert _outbox_row(engine, delivery_id).attempts == 1  # set aside, not retried
    assert smtp.attempts == 0
    with engine.connect() as conn:
        assert outbox_repo.sent_ids(conn, delivery_ids=[delivery_id]) == set()


def test_a_notifier_that_raises_is_set_aside_after_the_bound_with_one_traceback(
    ctx: Any, http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock,
    smtp: SmtpServer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    _mail_channel(http, auth(tokens["admin"]))
    delivery_id = _queue_mail(ctx, "Your GPUs this week")
    dispatcher = Dispatcher(ctx)
    smtp.script = ["451 4.3.0 busy"]  # a refusal first: the first internal error still says why
    assert dispatcher.drain() == 0
    calls: list[str] = []

    def broken(self: EmailNotifier, env: Any) -> None:
        calls.append(env.delivery_id)
        raise RuntimeError("template broke\nsecond line")

    monkeypatch.setattr(EmailNotifier, "send_message", broken)
    with caplog.at_level(logging.WARNING, logger="service.usecases.outbox"):
        for _ in range(INTERNAL_ERROR_ATTEMPTS - 1):
            clock.advance(3600)
            assert dispatcher.drain() == 0
    status, attempts, error = _outbox_row(engine, delivery_id)
    assert (status, attempts) == ("failed", INTERNAL_ERROR_ATTEMPTS)
    assert error.startswith("internal error: RuntimeError: template broke second line")
    assert f"attempt {INTERNAL_ERROR_ATTEMPTS} of {INTERNAL_ERROR_ATTEMPTS}" in error
    assert tuple(_notice(engine, delivery_id)) == ("failed", error)
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1 and delivery_id in tracebacks[0].getMessage()
    assert all("\n" not in r.getMessage() for r in caplog.records)  # the rest: one line each
    assert any("set aside" in r.getMessage() for r in caplog.records)
    clock.advance(3600)
    assert dispatcher.drain() == 0
    assert len(calls) == INTERNAL_ERROR_ATTEMPTS - 1  # the first try was SMTP's 451


def test_a_normal_owner_mail_still_arrives_and_reads_as_sent(
    ctx: Any, http: httpx.Client, tokens: dict[str, str], engine: Engine, smtp: SmtpServer
) -> None:
    _mail_channel(http, auth(tokens["admin"]))
    delivery_id = _queue_mail(ctx, "GPU Warden: your job slurm:7 (idle-held)")
    with engine.connect() as conn:
        assert outbox_repo.sent_ids(conn, delivery_ids=[delivery_id]) == set()  # queued only
    assert Dispatcher(ctx).drain() == 1
    (mail,) = smtp.received
    assert mail.rcpt_tos == ["alice@example.org"]
    assert mail.message["Subject"] == "GPU Warden: your job slurm:7 (idle-held)"
    assert mail.message["To"] == "alice@example.org" and mail.message["Bcc"] is None
    with engine.connect() as conn:
        assert outbox_repo.sent_ids(conn, delivery_ids=[delivery_id, "msg_other"]) == {delivery_id}
    assert tuple(_notice(engine, delivery_id)) == ("sent", None)


def test_a_webhook_id_with_cr_lf_is_refused_before_anything_is_sent(clock: FakeClock) -> None:
    note = Notification(
        delivery_id="msg_1\r\nX-Evil: 1", kind="firing", status="firing", policy="p",
        severity="warning", metric="sm_active", aggregate="avg", window="5m", op="<",
        threshold=0.3, value=0.1, scope="job", scope_key="slurm:1", labels={},
        active_since=clock(),
    )  # fmt: skip
    receiver = Receiver()
    try:
        channel = ChannelSpec(name="hook", type="webhook", url=receiver.url + "/in")
        with httpx.Client() as client, pytest.raises(ValidationFailed) as refused:
            WebhookNotifier(channel, client).send(note)
        assert refused.value.field == "header webhook-id"
        assert receiver.received == []
    finally:
        receiver.close()


def test_a_mail_channels_recipient_with_cr_lf_is_refused_naming_it(
    http: httpx.Client, tokens: dict[str, str]
) -> None:
    admin = auth(tokens["admin"])
    doc = {"name": "mail", "type": "email", "to": ["ops@example.org", "a@b.org\r\nBcc: x@y.org"]}
    r = http.post("/api/v1/channels", json=doc, headers=admin)
    assert r.status_code == 422, r.text
    (error,) = r.json()["detail"]
    assert error["loc"] == ["body", "to", 1] and "U+000D" in error["msg"], error
    assert http.get("/api/v1/channels", headers=admin).json() == []
