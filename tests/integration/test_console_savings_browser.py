"""The console shows proven savings (issue 46), in Debian's Chromium against the real app (both
stores): the fixed run's page says what its fix saved beside the promise, and the team's page
what its fixes saved over the range."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
from fastapi import FastAPI

from service.usecases.savings import savings_once
from tests.integration.browser_support import ARGS, CHROMIUM, Console, _need_browser, expect
from tests.savings_support import FIXED, STARVED, add_run
from tests.support import FakeClock, auth


def test_job_and_team_pages_show_the_measured_saving(
    app: FastAPI, server: str, http: httpx.Client, tokens: dict[str, str], clock: FakeClock
) -> None:
    _need_browser()
    from playwright.sync_api import sync_playwright

    t0 = clock() - timedelta(hours=3)
    add_run(http, tokens, "manual:bert-1", t0, 30, STARVED, 3000)
    add_run(http, tokens, "manual:bert-2", t0 + timedelta(minutes=40), 12, FIXED, 3000)
    savings_once(app.state.ctx)
    saving = http.get("/api/v1/jobs/manual:bert-2", headers=auth(tokens["reader"])).json()[
        "savings"
    ]
    with sync_playwright() as p:
        browser: Any = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            admin = Console(browser, server)
            admin.login(tokens["admin"])
            admin.open("/jobs/manual:bert-2")
            panel = admin.page.locator("#job-saving")
            expect(panel).to_have_attribute("data-verdict", "saved")
            assert admin.usd("#job-saving") == round(saving["realised_usd"], 2)
            text = panel.inner_text()
            assert "input starved 100% → 0% of the run" in text and "manual:bert-1" in text
            assert f"promised {round(saving['promised_fraction'] * 100)}%" in text
            admin.open("/jobs/manual:bert-1")
            assert admin.page.locator("#job-saving").count() == 0  # the run told the fix
            admin.open("/teams/nlp?start=-4h&end=now")
            assert admin.usd("#owner-saved .v") == round(saving["realised_usd"], 2)
            assert not admin.errors, admin.errors
        finally:
            browser.close()
