"""Report mails fit a mail client: each kind of periodic report (a user's, a team's, the admins';
weekly and daily), with long job ids, fixes and links, laid out by Debian's Chromium at 600 px (a
mail client's width) and 375 px (a phone's) never scrolls sideways."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, Literal

import pytest

from service.costs.periodic import JobLine, Period, Ranked, Report, Totals
from service.costs.report_render import render_html
from tests.integration.browser_support import ARGS, CHROMIUM

WEEK = Period(datetime(2026, 11, 30, tzinfo=UTC), datetime(2026, 12, 7, tzinfo=UTC), "weekly")
DAY = Period(datetime(2026, 12, 6, tzinfo=UTC), datetime(2026, 12, 7, tzinfo=UTC), "daily")
BASE = "https://gpuwarden.research-computing.example.edu"
FIX = (
    "Raise the DataLoader's num_workers (the GPU waited on input 61% of its busy time) and pin"
    " its memory; see docs/diagnosis.md#input-starved"
)


def job(i: int) -> JobLine:
    """A costly job as the real reports list them: a long Kubernetes id, a fix, a link."""
    job_id = f"k8s:computer-vision-research/train-resnet152-imagenet-ablation-{i}-7d9f8c6b5-x7k2p"
    return JobLine(
        job_id, "alexandra.konstantinopoulou", "computer-vision-research", 1234.56, 98765.43,
        54321.09, "input_starved", FIX, 12345.67, f"{BASE}/jobs/{job_id.replace('/', '%2F')}",
    )  # fmt: skip


Kind = Literal["user", "team", "admins"]


def report(kind: Kind, period: Period) -> Report:
    totals = Totals(4321.0, 123456.78, 65432.1, 43210.98, 22221.12, 42,
                    {"idle_held": 43210.98, "input_starved": 22221.12})  # fmt: skip
    ranked = [
        Ranked(f"computer-vision-research-group-{i}", 4321.0, 9876.5, "idle_held",
               f"{BASE}/teams/computer-vision-research-group-{i}")
        for i in range(5)
    ] if kind == "admins" else []  # fmt: skip
    name = {"user": "alexandra.konstantinopoulou", "team": "computer-vision-research"}
    return Report(kind, name.get(kind, "admins"), period, totals, totals,
                  [job(i) for i in range(10)], f"{BASE}/costs?since=7d&group_by=job",
                  ranked, ranked)  # fmt: skip


KINDS: list[tuple[Kind, Period]] = [(k, p) for k in ("user", "team", "admins") for p in (WEEK, DAY)]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.mark.parametrize("width", [600, 375])
@pytest.mark.parametrize(("kind", "period"), KINDS, ids=[f"{k}-{p.name}" for k, p in KINDS])
def test_every_report_kind_fits_a_mail_clients_width(
    browser: Any, kind: Kind, period: Period, width: int
) -> None:
    page = browser.new_page(viewport={"width": width, "height": 900})
    try:
        page.set_content(render_html(report(kind, period)))
        scroll = page.evaluate("document.documentElement.scrollWidth")
        assert scroll <= width, f"{kind} {period.name}: laid out at {scroll} px"
        # Every figure is still there: the fix column the old table cut off, too.
        text = page.inner_text("body")
        assert "saves about $12,345.67" in text and "$98,765.43 for 1,234.56 GPU-h" in text
    finally:
        page.close()
