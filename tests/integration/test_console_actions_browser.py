"""The console's Actions page and a job page's actions in Debian's Chromium (Playwright), against
the service on loopback with audit rows written as the ladder writes them, on both stores."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from sqlalchemy import Engine

from tests.alerting_support import auth
from tests.integration.actions_support import STEPS, record_skip, record_steps
from tests.integration.browser_support import (
    Console,
    browser,
    expect,
)
from tests.support import FakeClock, iso, make_batch

__all__ = ["browser"]  # the module's Chromium (a fixture), shared with the Notices page's tests

EVIL_REASON = '<img src=x onerror="window.__xss=1">'


@pytest.fixture
def console(browser, server, http, tokens, engine: Engine, clock: FakeClock) -> Iterator[Console]:
    """A reader logged in; jobs slurm:1 (three steps) and slurm:9 (none) on GPU-a0."""
    start = clock() - timedelta(minutes=5)
    batch = make_batch(start=start, count=10)
    assert http.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"])).status_code == 200
    for job in ("slurm:1", "slurm:9"):
        body = {"id": job, "user": "ana", "gpus": ["GPU-a0"], "started_at": iso(start)}
        r = http.post("/api/v1/jobs", json=body, headers=auth(tokens["admin"]))
        assert r.status_code == 201, r.text
    record_steps(engine, clock())
    c = Console(browser, server)
    c.login(tokens["reader"])
    yield c
    c.context.close()


def shown(c: Console, table: str = "#actions") -> list[str]:
    found: list[str] = c.page.locator(f"{table} tbody tr").evaluate_all(
        "rs => rs.map(r => r.dataset.outcome)"
    )
    return found


def test_the_actions_page_lists_every_step_and_its_filters_live_in_the_url(
    console: Console,
) -> None:
    console.open("/actions")
    assert shown(console) == ["skipped", "would", "failed", "reclaimed", "warned", "warned"]
    expect(console.page.locator('#action-cards [data-outcome="warned"] .v')).to_have_text("2")
    dry = console.page.locator('#actions tr[data-dry-run="1"]')
    expect(dry).to_have_count(1)
    expect(dry.locator("td").nth(6)).to_have_text("dry run")
    console.shot("actions", full_page=True)
    console.page.select_option("#action-outcome", "reclaimed")
    console.page.wait_for_url("**/actions?outcome=reclaimed")
    console.ready()
    expect(console.page.locator("#actions tbody tr")).to_have_count(1)
    assert shown(console) == ["reclaimed"]
    console.page.fill("#action-user", "bo")
    console.page.select_option("#action-outcome", "")
    console.page.wait_for_url("**/actions?user=bo")
    console.ready()
    expect(console.page.locator("#actions tbody tr")).to_have_count(2)
    assert shown(console) == ["skipped", "failed"]
    console.page.reload()
    console.ready()
    assert console.page.input_value("#action-user") == "bo" and shown(console) == [
        "skipped",
        "failed",
    ]
    user = console.page.locator("#actions tbody tr").first.locator("td").nth(3).locator("a")
    expect(user).to_have_attribute("href", "/users/bo")
    href = console.page.get_attribute("#actions-csv", "href") or ""
    assert parse_qs(urlsplit(href).query) == {"user": ["bo"], "limit": ["1000"], "format": ["csv"]}
    console.open("/actions?team=nobody")
    expect(console.page.locator("#no-actions")).to_be_visible()
    assert not console.errors, console.errors


def test_a_step_s_reason_holding_markup_shows_as_text(
    console: Console, engine: Engine, clock: FakeClock
) -> None:
    record_skip(
        engine, at=clock() - timedelta(minutes=1), job_id="slurm:4", user="eve", reason=EVIL_REASON
    )
    console.open("/actions?user=eve")
    expect(console.page.locator("#actions tbody tr td").nth(8)).to_have_text(EVIL_REASON)
    console.no_script_ran()


def test_a_job_page_shows_its_steps_and_a_job_without_any_says_so(console: Console) -> None:
    console.open("/jobs/slurm%3A1")
    rows = console.page.locator("#job-actions tbody tr")
    expect(rows).to_have_count(3)
    assert shown(console, "#job-actions") == ["reclaimed", "warned", "warned"]
    first = [rows.nth(0).locator("td").nth(i).inner_text() for i in range(4)]
    assert first[1:] == ["gpu-idle", "3. reclaim", "reclaimed"]
    assert "vs 0.05" in rows.nth(0).inner_text() and "$12.50" in rows.nth(0).inner_text()
    assert sum(1 for s in STEPS if s[2] == "slurm:1") == 3
    console.open("/jobs/slurm%3A9")
    expect(console.page.locator("#no-job-actions")).to_be_visible()
    nav = console.page.locator('#nav a[data-page="actions"]')
    expect(nav).to_have_attribute("href", "/actions")
    assert not console.errors, console.errors
