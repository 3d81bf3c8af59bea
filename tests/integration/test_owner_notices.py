"""Owner notices: a job policy addressed to ``owner`` mails the job's owner through a real SMTP
server on loopback (aiosmtpd), with figures that match the job's page to the cent; an unknown
owner falls back to the team, then the admins, and the fallback is recorded; SMTP replies follow
the delivery table; Slack direct messages reach the local receiver within Block Kit's limits."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from service.core.verdict import Verdict
from service.db import notices_repo, policies_repo
from service.db.rows import NewNotice
from service.db.schema import outbox
from service.notify.envelope import Message
from service.notify.message import OwnerNotice, render_owner_notice
from service.thresholds.owners import Addressee, OwnerEntry
from service.thresholds.policy import parse_channel
from service.usecases import notices
from service.usecases.evaluation import evaluate_once
from service.usecases.outbox import Dispatcher
from service.usecases.upkeep import rollup_once
from tests.alerting_support import add_job, add_price, auth, ingest, low_sm_policy
from tests.receivers import Receiver
from tests.smtp_support import SmtpServer
from tests.support import FakeClock, free_port, self_signed_cert

IDLE = {"sm_active": 0.0, "gpu_util": 0.0, "fb_used_bytes": 20 * 2**30}
USD = re.compile(r"\$([\d,]+\.\d\d)")


@pytest.fixture
def ctx(app: Any, smtp: SmtpServer) -> Any:
    ctx = app.state.ctx
    smtp.send_here(ctx.settings)
    ctx.settings.webhook_allow_nets = "127.0.0.0/8"
    ctx.settings.public_url = "https://warden.example"
    return ctx


def _directory(http: httpx.Client, admin: dict[str, str], entries: list[dict[str, Any]]) -> None:
    for e in entries:
        r = http.post("/api/v1/owners", json=e, headers=admin)
        assert r.status_code == 201, r.text


def _idle_jobs(
    http: httpx.Client, engine: Any, ctx: Any, clock: FakeClock, agent: str, jobs: dict[str, Any]
) -> None:
    """Each job of ``jobs`` (id -> (GPU uuid, user, team)) idle with memory held for 20 min."""
    start = clock() - timedelta(minutes=20)
    for _job, (uuid, _user, _team) in jobs.items():
        ingest(http, agent, start=start, count=120, gpu_uuids=(uuid,), metrics=IDLE)
    add_price(engine, "*", 3.0, start)
    for job, (uuid, user, team) in jobs.items():
        add_job(engine, job, (uuid,), started_at=start, user=user, team=team)
    rollup_once(ctx)


def _setup(http: httpx.Client, admin: dict[str, str]) -> None:
    r = http.post("/api/v1/channels", json={"name": "mail", "type": "email"}, headers=admin)
    assert r.status_code == 201, r.text
    policy = low_sm_policy(["owner"], window="10m", description="idle <b>& held</b>")
    r = http.post("/api/v1/policies", json=policy, headers=admin)
    assert r.status_code == 201, r.text


def _cents(value: float) -> str:
    return f"{value:,.2f}"


def test_an_owner_notice_arrives_by_mail_with_the_job_pages_figures(
    ctx: Any, http: httpx.Client, tokens: dict[str, str], engine: Any, clock: FakeClock,
    smtp: SmtpServer,
) -> None:  # fmt: skip
    admin, reader = auth(tokens["admin"]), auth(tokens["reader"])
    _setup(http, admin)
    _directory(
        http,
        admin,
        [{"kind": "user", "name": "alice", "email": "alice@example.org",
          "cc_email": "lead@example.org", "team": "vision"}],
    )  # fmt: skip
    _idle_jobs(
        http, engine, ctx, clock, tokens["agent"], {"slurm:7": ("GPU-a0", "alice", "vision")}
    )
    evaluate_once(ctx)
    assert Dispatcher(ctx).drain() == 1
    (mail,) = smtp.received
    msg = mail.message
    assert mail.rcpt_tos == ["alice@example.org", "lead@example.org"]
    assert msg["To"] == "alice@example.org" and msg["Cc"] == "lead@example.org"
    assert msg["From"] == "GPU Warden <warden@example.org>"
    assert msg["Auto-Submitted"] == "auto-generated" and msg["Message-ID"]
    assert msg.get_content_type() == "multipart/alternative"
    assert "slurm:7" in msg["Subject"] and "low-sm-activity" in msg["Subject"]
    text, html = mail.part("plain"), mail.part("html")

    job = http.get("/api/v1/jobs/slurm:7", headers=reader).json()
    s = job["summary"]
    fix = next(f for f in job["recommendations"] if f["cause"] == s["top_cause"])
    dollars = next(line for line in text.splitlines() if line.startswith("Dollars: "))
    assert dollars == (
        f"Dollars: cost so far ${_cents(s['cost_usd'])}; waste so far ${_cents(s['waste_usd'])}"
        f" (idle ${_cents(s['idle_usd'])} + fixable ${_cents(s['fixable_usd'])}, estimated)"
    )
    assert s["cost_usd"] > 0.9  # 20 idle minutes at $3/h: the figures are not all zero
    fix_line = next(line for line in text.splitlines() if line.startswith("Fix: "))
    assert fix_line.endswith(f"(saves about ${_cents(fix['saving_usd'])})"), fix_line
    assert f"Cause: {s['top_cause']}" in text
    seen = next(line for line in text.splitlines() if line.startswith("Seen: "))
    assert "avg sm_active over 10m = 0" in seen and "node node-a" in seen and "GPU-a0" in seen
    assert "since 20" in seen
    assert "Next: " in text
    assert "https://warden.example/jobs/slurm%3A7" in text
    # The HTML part says the same, escaped, with the link.
    assert f"${_cents(s['waste_usd'])}" in html
    assert 'href="https://warden.example/jobs/slurm%3A7"' in html
    assert "Policy: idle <b>& held</b>" in text
    assert "idle &lt;b&gt;&amp; held&lt;/b&gt;" in html and "<b>" not in html

    rows = http.get("/api/v1/notices", params={"job": "slurm:7"}, headers=admin).json()
    assert [(r["kind"], r["status"], r["asked"], r["recipient"], r["fallback"]) for r in rows] == [
        ("owner_notice", "sent", "user:alice", "user:alice", None)
    ]
    assert rows[0]["address"] == "alice@example.org, lead@example.org"
    assert rows[0]["channel"] == "mail" and rows[0]["sent_at"] is not None
    # Readers see what was sent and when, not the addresses.
    (as_reader,) = http.get("/api/v1/notices", params={"user": "alice"}, headers=reader).json()
    assert as_reader["address"] is None and as_reader["subject"] == rows[0]["subject"]

    # The repeat an hour later (repeat_interval 1h) is a second notice; none in between.
    clock.advance(30)
    evaluate_once(ctx)
    assert Dispatcher(ctx).drain() == 0


def test_an_unknown_owner_falls_back_to_the_team_then_the_admins(
    ctx: Any, http: httpx.Client, tokens: dict[str, str], engine: Any, clock: FakeClock,
    smtp: SmtpServer,
) -> None:  # fmt: skip
    admin = auth(tokens["admin"])
    _setup(http, admin)
    _directory(
        http,
        admin,
        [
            {"kind": "team", "name": "vision", "email": "vision@example.org"},
            {"kind": "admins", "name": "admins", "email": "gpu-admins@example.org"},
        ],
    )
    _idle_jobs(
        http, engine, ctx, clock, tokens["agent"],
        {"slurm:8": ("GPU-a0", "bob", "vision"), "slurm:9": ("GPU-a1", "carol", "nlp")},
    )  # fmt: skip
    evaluate_once(ctx)
    assert Dispatcher(ctx).drain() == 2
    by_to = {m.message["To"]: m for m in smtp.received}
    assert set(by_to) == {"vision@example.org", "gpu-admins@example.org"}
    assert "slurm:8" in by_to["vision@example.org"].message["Subject"]
    assert "slurm:9" in by_to["gpu-admins@example.org"].message["Subject"]
    # The notice says why it reached them.
    team_text = by_to["vision@example.org"].part("plain")
    assert "Why you: user bob has no address in the directory; sent to team vision" in team_text
    rows = http.get("/api/v1/notices", headers=admin).json()
    got = {(r["job_id"], r["asked"], r["recipient"], r["fallback"], r["status"]) for r in rows}
    assert got == {
        ("slurm:8", "user:bob", "team:vision", "team", "sent"),
        ("slurm:9", "user:carol", "admins", "admins", "sent"),
    }
    carol = next(r for r in rows if r["job_id"] == "slurm:9")
    assert carol["reason"] == (
        "user carol has no address in the directory; team nlp has no address either; sent to admins"
    )


def _queue(ctx: Any, entry: OwnerEntry, *, key: str | None = None) -> list[NewNotice]:
    msg = Message(subject="s", text="t", html="<p>t</p>", slack_text="t")
    with ctx.engine.begin() as conn:
        return notices.queue_message(
            conn, ctx, addressee=Addressee(entry.key, entry), message=msg, kind="report", key=key
        )


def test_smtp_replies_follow_the_delivery_table(
    ctx: Any, http: httpx.Client, tokens: dict[str, str], smtp: SmtpServer, clock: FakeClock
) -> None:
    admin = auth(tokens["admin"])
    assert http.post("/api/v1/channels", json={"name": "mail", "type": "email"},
                     headers=admin).status_code == 201  # fmt: skip
    alice = OwnerEntry(kind="user", name="alice", email="alice@example.org")
    (queued,) = _queue(ctx, alice, key="weekly:2026-12-07:alice")
    assert _queue(ctx, alice, key="weekly:2026-12-07:alice") == []  # once per key
    dispatcher = Dispatcher(ctx)

    def state() -> tuple[str, int]:
        with ctx.engine.connect() as conn:
            row = conn.execute(
                select(outbox.c.status, outbox.c.attempts).where(
                    outbox.c.delivery_id == queued["delivery_id"]
                )
            ).one()
        return row.status, row.attempts

    smtp.script = ["451 4.3.0 mailbox busy", "550 5.1.1 no such user"]
    dispatcher.drain()
    assert state() == ("pending", 1)  # 4xx: temporary, retried
    (notice,) = http.get("/api/v1/notices", headers=admin).json()
    assert notice["status"] == "pending" and "SMTP 451" in notice["error"]
    clock.advance(3600)
    dispatcher.drain()
    assert state() == ("failed", 2)  # 5xx: permanent
    (notice,) = http.get("/api/v1/notices", headers=admin).json()
    assert notice["status"] == "failed" and "SMTP 550" in notice["error"]
    assert smtp.received == []

    # No server at all: no answer, retried.
    (again,) = _queue(ctx, alice)
    ctx.settings.smtp_port = free_port()
    dispatcher.drain()
    with ctx.engine.connect() as conn:
        status = conn.execute(
            select(outbox.c.status).where(outbox.c.delivery_id == again["delivery_id"])
        ).scalar_one()
    assert status == "pending"


def test_no_address_and_no_admins_is_recorded_as_unreachable(
    ctx: Any, http: Any, tokens: Any
) -> None:
    addressee = notices.resolve(ctx, user="dave", team=None)
    assert addressee.entry is None and addressee.fallback == "admins"
    msg = Message(subject="s", text="t", html="t", slack_text="t")
    with ctx.engine.begin() as conn:
        (n,) = notices.queue_message(conn, ctx, addressee=addressee, message=msg, kind="report")
    assert n["status"] == "unreachable"
    (row,) = http.get("/api/v1/notices", headers=auth(tokens["admin"])).json()
    assert row["status"] == "unreachable" and row["asked"] == "user:dave"
    assert "no address" in row["reason"] and "sent to admins" in row["reason"]


@pytest.fixture
def slack() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def test_a_slack_dm_reaches_the_user_within_block_kit_limits_escaped(
    ctx: Any, http: httpx.Client, tokens: dict[str, str], slack: Receiver
) -> None:
    admin = auth(tokens["admin"])
    ctx.settings.slack_bot_token = "xoxb-test-token"
    channel = {"name": "dm", "type": "slack_dm", "url": slack.url + "/api/chat.postMessage"}
    assert http.post("/api/v1/channels", json=channel, headers=admin).status_code == 201
    alice = OwnerEntry(kind="user", name="alice", slack="U0ALICE", cc_slack="C0VISION")
    notice = OwnerNotice(
        job_id="slurm:<!channel>",
        user="<!here>",
        policy="idle-held",
        node="node-a",
        gpus="0 (GPU-a0)",
        since=ctx.clock() - timedelta(hours=1),
        seen="avg activity over 1h = 0 (< 0.05)",
        verdict=Verdict(
            top_cause="idle_held",
            cost_usd=3.0,
            waste_usd=3.0,
            idle_usd=3.0,
            fixable_usd=0.0,
            fix="release the GPU & <exit> " + "x" * 5000,
            fix_saving_usd=3.0,
        ),
        next_step="the job is cancelled",
        next_step_at=ctx.clock() + timedelta(minutes=15),
        report_url="https://warden.example/jobs/slurm%3A1?a=1&b=2",
    )
    with ctx.engine.begin() as conn:
        queued = notices.queue_owner_notice(
            conn, ctx, notice=notice, addressee=Addressee("user:alice", alice)
        )
    assert [n["address"] for n in queued] == ["U0ALICE", "C0VISION"]
    assert Dispatcher(ctx).drain() == 2
    posts = slack.wait_for(2)
    assert [p.path for p in posts] == ["/api/chat.postMessage"] * 2
    assert {p.headers["authorization"] for p in posts} == {"Bearer xoxb-test-token"}
    bodies = [p.json() for p in posts]
    assert [b["channel"] for b in bodies] == ["U0ALICE", "C0VISION"]
    body = bodies[0]
    blocks = body["blocks"]
    assert len(blocks) <= 50 and len(body["text"]) <= 3000
    assert blocks[0]["type"] == "header" and len(blocks[0]["text"]["text"]) <= 150
    for b in blocks:
        if "text" in b and b["type"] == "section":
            assert len(b["text"]["text"]) <= 3000
        for f in b.get("fields", []):
            assert len(f["text"]) <= 2000
        assert len(b.get("fields", [])) <= 10
    flat = json.dumps([b for b in blocks if b["type"] != "header"]) + body["text"]
    assert "<!channel>" not in flat and "<!here>" not in flat and "<exit>" not in flat
    assert "&lt;!channel&gt;" in flat and "&amp; &lt;exit&gt;" in flat
    assert "<https://warden.example/jobs/slurm%3A1?a=1&amp;b=2|The job's page>" in flat
    assert "the job is cancelled at 20" in flat


def test_render_owner_notice_cuts_within_limits() -> None:
    from datetime import UTC, datetime

    n = OwnerNotice(
        job_id="j" * 300, policy="p", since=datetime(2026, 12, 2, tzinfo=UTC), seen="s" * 9000
    )
    m = render_owner_notice(n)
    assert len(m.slack_blocks[0]["text"]["text"]) <= 150
    assert all(len(f["text"]) <= 2000 for f in m.slack_blocks[2]["fields"])
    assert len(m.slack_text) <= 3000 and len(m.subject) <= 998


LOOKUP = """
import pathlib, sys
user = sys.argv[1]
pathlib.Path(sys.argv[2]).open("a").write(user + "\\n")
if user == "slow":
    import time; time.sleep(10)
if user == "erin":
    print(f"{user}:x:1001:1001:Erin Example,,,,erin@example.org:/home/{user}:/bin/bash")
else:
    sys.exit(2)  # getent's "no such user"
"""


def test_the_lookup_command_finds_a_user_and_its_answer_is_cached(
    ctx: Any, tmp_path: Path, clock: FakeClock, http: httpx.Client, tokens: dict[str, str]
) -> None:
    script, calls = tmp_path / "lookup.py", tmp_path / "calls"
    script.write_text(LOOKUP)
    ctx.settings.owner_lookup_command = f"{sys.executable} {script} {{user}} {calls}"
    ctx.settings.owner_lookup_ttl_seconds = 600.0
    ctx.settings.owner_lookup_timeout_seconds = 0.5
    _directory(http, auth(tokens["admin"]),
               [{"kind": "team", "name": "ops", "email": "ops@example.org"}])  # fmt: skip
    erin = notices.resolve(ctx, user="erin", team="ops")
    assert erin.fallback is None and erin.entry is not None
    assert erin.entry.email == "erin@example.org"
    assert notices.resolve(ctx, user="erin", team="ops").entry == erin.entry
    assert calls.read_text().split() == ["erin"]  # the second answer came from the cache
    owners = http.get("/api/v1/owners", params={"kind": "user"}, headers=auth(tokens["admin"]))
    (cached,) = owners.json()
    assert cached["source"] == "lookup" and cached["expires_at"] is not None

    # No such user: the team; a command that hangs: the team too, after the timeout.
    frank = notices.resolve(ctx, user="frank", team="ops")
    slow = notices.resolve(ctx, user="slow", team="ops")
    for a, user in ((frank, "frank"), (slow, "slow")):
        assert a.fallback == "team" and a.entry is not None and a.entry.name == "ops"
        assert a.reason == f"user {user} has no address in the directory; sent to team ops"
    clock.advance(601)
    notices.resolve(ctx, user="erin", team="ops")
    assert calls.read_text().split() == ["erin", "frank", "slow", "erin"]  # expired: asked again


@pytest.mark.parametrize("tls", ["starttls", "tls"])
def test_mail_goes_over_starttls_or_implicit_tls_with_the_login(
    app: Any, tmp_path: Path, tls: str
) -> None:
    ctx = app.state.ctx
    cert = self_signed_cert(tmp_path, "localhost")
    server = SmtpServer(tls=tls, cert=cert, login=("warden", "s3cret"))  # type: ignore[arg-type]
    try:
        server.send_here(ctx.settings)
        with ctx.engine.begin() as conn:
            policies_repo.put_channel(
                conn, channel=parse_channel({"name": "mail", "type": "email"}), source="api",
                now=ctx.clock(),
            )  # fmt: skip
        alice = OwnerEntry(kind="user", name="alice", email="alice@example.org")
        ctx.settings.smtp_user, ctx.settings.smtp_password = "warden", "wrong"
        _queue(ctx, alice)
        Dispatcher(ctx).drain()
        assert server.received == []
        with ctx.engine.connect() as conn:
            (row,) = notices_repo.list_notices(conn)
        assert row["status"] == "pending" and "SMTP 535" in str(row["error"])  # kept, retried
        ctx.settings.smtp_password = "s3cret"
        with ctx.engine.begin() as conn:  # due again now
            conn.execute(outbox.update().values(next_attempt_at=ctx.clock()))
        assert Dispatcher(ctx).drain() == 1
        (mail,) = server.received
        assert mail.rcpt_tos == ["alice@example.org"] and mail.part("plain").strip() == "t"
        # A certificate the client does not trust: kept and retried, never sent in the clear.
        ctx.settings.smtp_ca_file = None
        _queue(ctx, alice)
        Dispatcher(ctx).drain()
        with ctx.engine.connect() as conn:
            newest = notices_repo.list_notices(conn)[0]
        assert newest["status"] == "pending" and "not trusted" in str(newest["error"])
        assert len(server.received) == 1
    finally:
        server.close()


def test_the_sent_record_outlives_the_outbox_then_goes(
    ctx: Any, http: httpx.Client, tokens: dict[str, str], smtp: SmtpServer, clock: FakeClock
) -> None:
    admin = auth(tokens["admin"])
    assert http.post("/api/v1/channels", json={"name": "mail", "type": "email"},
                     headers=admin).status_code == 201  # fmt: skip
    _queue(ctx, OwnerEntry(kind="user", name="alice", email="alice@example.org"))
    assert Dispatcher(ctx).drain() == 1
    clock.advance(30 * 86400)  # the outbox forgets sent deliveries after a week
    Dispatcher(ctx).drain()
    with ctx.engine.connect() as conn:
        assert conn.execute(select(outbox.c.id)).all() == []
    assert [n["status"] for n in http.get("/api/v1/notices", headers=admin).json()] == ["sent"]
    clock.advance(ctx.settings.notices_retention_days * 86400)
    Dispatcher(ctx).drain()
    assert http.get("/api/v1/notices", headers=admin).json() == []
