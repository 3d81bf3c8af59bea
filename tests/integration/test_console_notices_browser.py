"""What was sent to people, and the periodic report's opt-out, in the console (Debian's Chromium
through Playwright) against the service on loopback, on both stores: a user's page, a job's
page and the Actions page list the notices; an admin opts a user out and back in."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from service.db import notices_repo
from tests.alerting_support import auth
from tests.integration.browser_support import Console, browser, expect
from tests.support import FakeClock, iso, make_batch

__all__ = ["browser"]  # the module's Chromium, shared with the Actions page's tests

NOTICES: list[dict[str, Any]] = [
    {"delivery_id": "d1", "kind": "owner_notice", "subject": "slurm:1 idle on node-a",
     "job_id": "slurm:1", "policy": "gpu-idle", "asked": "user:ana", "recipient": "user:ana",
     "channel": "mail", "address": "ana@example.org", "status": "sent"},
    {"delivery_id": "d2", "kind": "report", "subject": "Your GPUs this week: $12.50",
     "asked": "user:ana", "recipient": "user:ana", "channel": "mail",
     "address": "ana@example.org", "status": "pending"},
    {"delivery_id": "d3", "kind": "owner_notice", "subject": "slurm:9 idle on node-a",
     "job_id": "slurm:9", "policy": "gpu-idle", "asked": "user:ghost", "recipient": "team:vision",
     "fallback": "team", "reason": "no address for user ghost", "channel": "team-chat",
     "status": "failed", "error": "HTTP 500"},
]  # fmt: skip


@pytest.fixture
def stored(server, http: httpx.Client, tokens, engine: Engine, clock: FakeClock) -> None:
    """Jobs slurm:1 (ana) and slurm:9 (ghost) on GPU-a0 and the three notices above."""
    start = clock() - timedelta(minutes=5)
    batch = make_batch(start=start, count=10)
    assert http.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"])).status_code == 200
    for job, user in (("slurm:1", "ana"), ("slurm:9", "ghost")):
        body = {"id": job, "user": user, "gpus": ["GPU-a0"], "started_at": iso(start)}
        r = http.post("/api/v1/jobs", json=body, headers=auth(tokens["admin"]))
        assert r.status_code == 201, r.text
    with engine.begin() as conn:
        notices_repo.record(conn, NOTICES, now=clock() - timedelta(minutes=1))


def logged_in(browser: Any, server: str, token: str) -> Console:
    c = Console(browser, server)
    c.login(token)
    return c


def shown(c: Console, table: str) -> list[str]:
    found: list[str] = c.page.locator(f"{table} tbody tr").evaluate_all(
        "rs => rs.map(r => `${r.dataset.kind}/${r.dataset.status}`)"
    )
    return found


def test_notices_show_on_the_users_page_the_jobs_page_and_beside_the_actions(
    stored: None, browser: Any, server: str, tokens
) -> None:
    c = logged_in(browser, server, tokens["reader"])
    try:
        c.open("/users/ana")
        assert sorted(shown(c, "#owner-notices")) == ["owner_notice/sent", "report/pending"]
        # Addresses are for admins: a reader sees the channel only.
        assert "ana@example.org" not in c.page.inner_text("#owner-notices")
        expect(c.page.locator("#owner-report")).to_have_attribute("data-opted-out", "0")
        expect(c.page.locator("#owner-opt")).to_have_count(0)
        c.open("/jobs/slurm%3A9")
        assert shown(c, "#job-notices") == ["owner_notice/failed"]
        row = c.page.inner_text("#job-notices tbody tr")
        assert "team:vision (fallback: team, no address for user ghost)" in row
        c.open("/actions")
        assert sorted(shown(c, "#notices")) == [
            "owner_notice/failed",
            "owner_notice/sent",
            "report/pending",
        ]
        c.open("/actions?user=ghost")
        assert shown(c, "#notices") == ["owner_notice/failed"]
        c.open("/users/nobody")
        expect(c.page.locator("#owner-notices-none")).to_be_visible()
        assert not c.errors, c.errors
    finally:
        c.context.close()


def test_an_admin_opts_a_user_out_of_the_report_and_back_in(
    stored: None, browser: Any, server: str, http: httpx.Client, tokens
) -> None:
    c = logged_in(browser, server, tokens["admin"])
    reader = auth(tokens["reader"])
    try:
        c.open("/users/ana")
        assert "ana@example.org" in c.page.inner_text("#owner-notices")
        c.page.click("#owner-opt")
        expect(c.page.locator("#owner-report")).to_have_attribute("data-opted-out", "1")
        opted = http.get("/api/v1/reports/opt-outs", headers=reader).json()
        assert [o["recipient"] for o in opted] == ["user:ana"]
        expect(c.page.locator("#owner-report-state")).to_contain_text("Opted out")
        c.page.click("#owner-opt")
        expect(c.page.locator("#owner-report")).to_have_attribute("data-opted-out", "0")
        assert http.get("/api/v1/reports/opt-outs", headers=reader).json() == []
        assert not c.errors, c.errors
    finally:
        c.context.close()
