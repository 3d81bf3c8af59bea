"""Periodic reports over real HTTP on SQLite and PostgreSQL: a week's reports reach a webhook
once, their figures are the cost report's to the cent, quiet users get one line (or none),
opted-out users none."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from service.db.schema import outbox, report_sends
from service.usecases.outbox import Dispatcher
from service.usecases.periodic_reports import reports_once
from tests.alerting_support import wait_until
from tests.integration.periodic_support import mail_the_owners, week
from tests.receivers import Receiver
from tests.smtp_support import SmtpServer
from tests.support import iso

__all__ = ["week"]  # the fixture periodic_support shares with the unsubscribe tests

WEEK = (datetime(2026, 11, 30, tzinfo=UTC), datetime(2026, 12, 7, tzinfo=UTC))
DOLLARS = re.compile(r"\$[0-9,]+\.[0-9]{2}")


def cost_report(
    http: httpx.Client, week: tuple[datetime, datetime] = WEEK, **who: str
) -> dict[str, Any]:
    params = {"start": iso(week[0]), "end": iso(week[1]), "group_by": "job", **who}
    r = http.get("/api/v1/reports/cost", params=params)
    assert r.status_code == 200, r.text
    report: dict[str, Any] = r.json()
    return report


def cost_totals(http: httpx.Client, **who: str) -> dict[str, Any]:
    totals: dict[str, Any] = cost_report(http, WEEK, **who)["totals"]
    return totals


def cost_rows(http: httpx.Client, **who: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = cost_report(http, WEEK, **who)["rows"]
    return rows


def by_recipient(receiver: Receiver) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for got in receiver.received:
        data = got.json()["data"]
        assert data["recipient"] not in out, f"{data['recipient']} got two reports"
        out[data["recipient"]] = data
    return out


def test_weekly_reports_carry_the_cost_reports_figures_once(week, receiver: Receiver) -> None:
    http, ctx, clock = week
    done = reports_once(ctx)
    assert done.period is not None and (done.period.start, done.period.end) == WEEK
    assert done.outcomes == {
        "user:alice": "queued", "user:bob": "queued", "team:vision": "queued",
        "team:nlp": "queued", "admins": "queued",
    }  # fmt: skip
    assert Dispatcher(ctx).drain() == 5
    got = by_recipient(receiver)
    assert {r.json()["type"] for r in receiver.received} == {"report.weekly"}

    alice = got["user:alice"]
    api = cost_totals(http, user="alice")
    figures = alice["figures"]["totals"]
    for name in ("cost_usd", "waste_usd", "idle_usd", "fixable_usd"):
        assert f"{figures[name]:.2f}" == f"{api[name]:.2f}", name
    text = alice["text"]
    assert f"Cost: ${api['cost_usd']:,.2f}" in text
    assert (
        f"Waste: ${api['waste_usd']:,.2f} = idle ${api['idle_usd']:,.2f} + fixable "
        f"${api['fixable_usd']:,.2f}" in text
    )
    assert f"GPU-hours: {api['held_seconds'] / 3600:,.2f} over 1 job" in text
    assert "Waste by cause: idle_held $2.00" in text
    before = cost_report(http, (WEEK[0] - timedelta(days=7), WEEK[0]), user="alice")["totals"]
    cost_up, waste_up = api["cost_usd"] - before["cost_usd"], api["waste_usd"] - before["waste_usd"]
    assert (
        f"Change since the week before: cost +${cost_up:,.2f} "
        f"(+{cost_up / before['cost_usd']:.0%}), waste +${waste_up:,.2f} "
        f"(+{waste_up / before['waste_usd']:.0%})" in text
    )
    job = alice["figures"]["top_jobs"][0]
    assert job["job_id"] == "slurm:1" and job["url"] == "https://warden.example/jobs/slurm%3A1"
    assert "1. slurm:1: $4.00 for 1.00 GPU-h, waste $2.00, top cause idle_held" in text
    row = cost_rows(http, user="alice")[0]
    fix = row["fixes"][0]
    assert f"   fix: {fix['action']} (saves about ${fix['saving_usd']:,.2f})\n" in text
    assert alice["page_url"] == (
        "https://warden.example/users/alice?start=2026-11-30T00:00:00Z&end=2026-12-07T00:00:00Z"
    )

    # Bob ran nothing this week: his report is one line, with his page.
    assert got["user:bob"]["text"].strip().splitlines() == [
        "User bob ran no GPU jobs in the week of 2026-11-30 "
        "(https://warden.example/users/bob?start=2026-11-30T00:00:00Z&end=2026-12-07T00:00:00Z)."
    ]
    # The admins' fleet totals count every GPU's held time, a job's or not (as by node).
    fleet = cost_report(http, group_by="node")["totals"]
    admins = got["admins"]
    for name in ("cost_usd", "waste_usd", "idle_usd", "fixable_usd"):
        assert f"{admins['figures']['totals'][name]:.2f}" == f"{fleet[name]:.2f}", name
    assert f"Cost: ${fleet['cost_usd']:,.2f}" in admins["text"]
    assert [u["name"] for u in admins["figures"]["worst_users"]] == ["alice"]
    assert "1. alice: waste $2.00 of $4.00, top cause idle_held" in admins["text"]

    # Once per period: a second round, another replica's or after a restart, queues nothing.
    assert reports_once(ctx).outcomes == {}
    clock.advance(3600)
    assert reports_once(ctx).outcomes == {}
    with ctx.engine.connect() as conn:
        assert len(conn.execute(select(outbox)).all()) == 5
        sends = conn.execute(select(report_sends.c.recipient, report_sends.c.status)).all()
    assert sorted(sends) == sorted([*((r, "queued") for r in got), ("__period__", "queued")])


def test_opted_out_and_quiet_users_get_no_report(week, receiver: Receiver, engine) -> None:
    http, ctx, _clock = week
    r = http.put("/api/v1/reports/opt-outs/user/alice")
    assert r.status_code == 200, r.text
    assert http.get("/api/v1/reports/opt-outs").json()[0]["recipient"] == "user:alice"
    ctx.settings = ctx.settings.model_copy(update={"report_no_jobs": "skip"})
    done = reports_once(ctx)
    assert done.outcomes["user:alice"] == "opted_out"
    assert done.outcomes["user:bob"] == "no_jobs" and done.outcomes["team:nlp"] == "no_jobs"
    Dispatcher(ctx).drain()
    assert sorted(by_recipient(receiver)) == ["admins", "team:vision"]


SAMPLE = re.compile(r"<!-- sample-text -->\n```text\n(.*?)```", re.S)


def test_the_docs_sample_is_the_report_as_it_arrives(week, receiver: Receiver) -> None:
    _http, ctx, _clock = week
    reports_once(ctx)
    Dispatcher(ctx).drain()
    alice = by_recipient(receiver)["user:alice"]
    doc = (Path(__file__).resolve().parents[2] / "docs" / "reports.md").read_text()
    found = SAMPLE.search(doc)
    assert found is not None, "docs/reports.md lost its sample text block"
    assert found.group(1) == alice["text"], alice["text"]


def test_the_weekly_report_arrives_by_mail_with_the_cost_reports_figures(
    week, smtp: SmtpServer
) -> None:
    """A real SMTP server on loopback gets alice's, her team's and the admins' report; bob has
    no address, so his report reaches no one else and the notice says why."""
    http, ctx, _clock = week
    mail_the_owners(http, ctx, smtp)
    done = reports_once(ctx)
    assert done.outcomes["user:bob"] == "queued"  # to the report channel only
    Dispatcher(ctx).drain()
    by_to = {m.message["To"]: m for m in smtp.received}
    assert sorted(by_to) == ["alice@example.org", "gpu-admins@example.org", "vision@example.org"]

    mail = by_to["alice@example.org"]
    msg = mail.message
    api = cost_totals(http, user="alice")
    assert msg["Subject"] == (
        f"GPU Warden weekly report, user alice, week of 2026-11-30: ${api['waste_usd']:,.2f} of "
        f"${api['cost_usd']:,.2f} wasted"
    )
    assert msg["From"] == "GPU Warden <warden@example.org>"
    assert msg.get_content_type() == "multipart/alternative"
    text, html = mail.part("plain"), mail.part("html")
    for part in (text, html):
        assert f"Cost: ${api['cost_usd']:,.2f}" in part
        assert (
            f"Waste: ${api['waste_usd']:,.2f} = idle ${api['idle_usd']:,.2f} + fixable "
            f"${api['fixable_usd']:,.2f}" in part
        )
        assert "slurm:1" in part
    page = "https://warden.example/users/alice?start=2026-11-30T00:00:00Z&end=2026-12-07T00:00:00Z"
    assert f"Details: {page}" in text and page.replace("&", "&amp;") in html
    # Every dollar in the mail is one of the cost report's, to the cent.
    row = cost_rows(http, user="alice")[0]
    figures = {f"${v:,.2f}" for v in (*api.values(), *row.values(), row["fixes"][0]["saving_usd"])
               if isinstance(v, float)}  # fmt: skip
    before = cost_report(http, (WEEK[0] - timedelta(days=7), WEEK[0]), user="alice")["totals"]
    changes = {f"${abs(api[k] - before[k]):,.2f}" for k in ("cost_usd", "waste_usd")}
    assert set(DOLLARS.findall(text)) <= figures | changes | {"$0.00"}

    admins = by_to["gpu-admins@example.org"].part("plain")
    fleet = cost_report(http, group_by="node")["totals"]
    assert f"Cost: ${fleet['cost_usd']:,.2f}" in admins and "1. alice: waste $2.00" in admins

    notices = http.get("/api/v1/notices", params={"kind": "report"}).json()
    bob = next(n for n in notices if n["asked"] == "user:bob")
    assert bob["status"] == "unreachable" and "no address" in bob["reason"]
    sent = {n["asked"]: n["status"] for n in notices if n["status"] != "unreachable"}
    assert sent == {"user:alice": "sent", "team:vision": "sent", "admins": "sent"}
    # A second round (a restart, another replica) mails no one again.
    assert reports_once(ctx).outcomes == {}
    Dispatcher(ctx).drain()
    assert len(smtp.received) == 3


def test_a_slack_channel_gets_blocks_within_block_kits_limits(week) -> None:
    http, ctx, _clock = week
    slack = Receiver()
    try:
        channel = {"name": "slack-reports", "type": "slack", "url": slack.url + "/services/T/B/X"}
        assert http.post("/api/v1/channels", json=channel).status_code == 201
        ctx.settings.report_channels = "slack-reports"
        reports_once(ctx)
        dispatcher = Dispatcher(ctx)
        # Slack's channel is rate limited (a message a second): each drain sends what it may.
        wait_until(lambda: dispatcher.drain() >= 0 and len(slack.received) == 5, timeout=30)
        bodies = [m.json() for m in slack.received]
    finally:
        slack.close()
    assert len(bodies) == 5  # alice, bob, vision, nlp, admins
    alice = next(b for b in bodies if "user alice" in b["text"])
    assert alice["text"].endswith(": $2.00 of $4.00 wasted")
    kinds = [b["type"] for b in alice["blocks"]]
    assert kinds == ["header", "section", "section", "context"]
    assert len(alice["blocks"][0]["text"]["text"]) <= 150
    assert all(len(b["text"]["text"]) <= 3000 for b in alice["blocks"] if b["type"] == "section")
    assert "<https://warden.example/jobs/slurm%3A1|job page>" in alice["blocks"][2]["text"]["text"]
    assert alice["blocks"][3]["elements"][0]["text"] == (
        "<https://warden.example/users/alice?start=2026-11-30T00:00:00Z&amp;"
        "end=2026-12-07T00:00:00Z|Details>"
    )
