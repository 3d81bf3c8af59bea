"""The periodic report's periods and renderings: weeks run Monday to Monday, Slack blocks stay
within Block Kit's limits, and text from jobs (ids, users) is escaped in HTML and Slack."""

from __future__ import annotations

import html.parser
from datetime import UTC, datetime
from typing import Any

from service.core.slack_text import BLOCKS_MAX as SLACK_BLOCKS_MAX
from service.core.slack_text import FIELD_MAX as SLACK_FIELD_MAX
from service.core.slack_text import FIELDS_MAX as SLACK_FIELDS_MAX
from service.core.slack_text import HEADER_MAX as SLACK_HEADER_MAX
from service.core.slack_text import SECTION_MAX as SLACK_SECTION_MAX
from service.costs.periodic import (
    JobLine,
    Period,
    Ranked,
    Report,
    Totals,
    change,
    last_ended,
)
from service.costs.report_render import render

WEEK = Period(datetime(2026, 11, 30, tzinfo=UTC), datetime(2026, 12, 7, tzinfo=UTC), "weekly")
EVIL = "<!channel> & <script>alert(1)</script>|x"


def test_a_week_runs_monday_to_monday_and_waits_for_its_delay() -> None:
    monday = datetime(2026, 12, 7, 0, 10, tzinfo=UTC)
    p = last_ended(monday, length_seconds=7 * 86400, delay_seconds=900, name="weekly")
    assert (p.start, p.end) == (
        datetime(2026, 11, 23, tzinfo=UTC),
        datetime(2026, 11, 30, tzinfo=UTC),
    )
    later = last_ended(monday.replace(minute=20), length_seconds=7 * 86400, delay_seconds=900,
                       name="weekly")  # fmt: skip
    assert (later.start, later.end) == (WEEK.start, WEEK.end)
    assert later.start.weekday() == 0 and later.before().end == later.start
    day = last_ended(monday, length_seconds=86400, delay_seconds=0, name="daily")
    assert day.start == datetime(2026, 12, 6, tzinfo=UTC) and day.label() == "2026-12-06"


def test_change_in_words() -> None:
    assert change(12.0, 10.0) == "+$2.00 (+20%)"
    assert change(5.0, 10.0) == "-$5.00 (-50%)"
    assert change(10.0, 10.0) == "no change"
    assert change(3.0, 0.0) == "+$3.00"
    assert change(None, 1.0) == "n/a"


def big_report(n_jobs: int = 20, n_ranked: int = 10) -> Report:
    totals = Totals(123.456, 4321.987, 1234.567, 1000.0, 234.567, n_jobs,
                    {"idle_held": 1000.0, "launch_bound": 234.567})  # fmt: skip
    jobs = [
        JobLine(f"{EVIL}-{i}" * 40, EVIL, EVIL, 10.0, 100.0, 50.0, "idle_held", EVIL * 100, 25.0,
                f"https://warden.example/jobs/{i}")
        for i in range(n_jobs)
    ]  # fmt: skip
    ranked = [Ranked(EVIL * 50, 1.0, 2.0, "idle_held", "https://w/u") for _ in range(n_ranked)]
    return Report("admins", "admins", WEEK, totals, totals, jobs, "https://warden.example/costs",
                  ranked, ranked)  # fmt: skip


def walk_texts(doc: Any) -> list[str]:
    if isinstance(doc, dict):
        return [t for v in doc.values() for t in walk_texts(v)]
    if isinstance(doc, list):
        return [t for v in doc for t in walk_texts(v)]
    return [doc] if isinstance(doc, str) else []


def test_slack_blocks_stay_within_block_kit_limits_and_escape_text() -> None:
    slack = render(big_report()).slack
    blocks = slack["blocks"]
    assert len(blocks) <= SLACK_BLOCKS_MAX
    assert len(slack["text"]) <= SLACK_SECTION_MAX
    for b in blocks:
        if b["type"] == "header":
            assert len(b["text"]["text"]) <= SLACK_HEADER_MAX
        if b["type"] == "section" and "text" in b:
            assert len(b["text"]["text"]) <= SLACK_SECTION_MAX
        if b["type"] == "section" and "fields" in b:
            assert len(b["fields"]) <= SLACK_FIELDS_MAX
            assert all(len(f["text"]) <= SLACK_FIELD_MAX for f in b["fields"])
    mrkdwn = [t for b in blocks if b["type"] != "header" for t in walk_texts(b) if t != "mrkdwn"]
    for text in mrkdwn:
        # Our own links are <url|label>; nothing from a job may open one or ping a channel.
        outside_links = text
        for url in ("https://warden.example/jobs/", "https://warden.example/costs", "https://w/u"):
            outside_links = outside_links.replace("<" + url, "")
        assert "<!channel>" not in text and "<script>" not in outside_links
    assert any("&lt;!channel&gt; &amp;" in t for t in mrkdwn)


class Collect(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.data: list[str] = []

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.data.append(data)


def test_html_escapes_every_value_and_text_is_plain() -> None:
    r = render(big_report(n_jobs=3, n_ranked=2))
    parsed = Collect()
    parsed.feed(r.html)
    assert "script" not in parsed.tags
    assert any(EVIL in d for d in parsed.data)  # shown as text, whole
    assert (
        "Cost: $4,321.99" in r.text
        and "Waste: $1,234.57 = idle $1,000.00 + fixable $234.57" in r.text
    )
    assert r.subject.startswith("GPU Warden weekly report, the fleet, week of 2026-11-30")


def test_no_jobs_is_one_line() -> None:
    quiet = Report("user", "bob", WEEK, None, None, [], "https://warden.example/users/bob")
    r = render(quiet)
    assert r.text == (
        "User bob ran no GPU jobs in the week of 2026-11-30 (https://warden.example/users/bob).\n"
    )
    assert r.subject.endswith(": no GPU jobs")


def test_a_fleet_that_held_no_gpu_gets_the_one_line_report() -> None:
    from service.costs.periodic import PeriodData, build_reports

    empty = {"rows": [], "totals": {"held_seconds": 0.0, "cost_usd": 0.0, "waste_usd": 0.0,
                                    "idle_usd": 0.0, "fixable_usd": 0.0, "jobs": 0, "causes": {}}}  # fmt: skip
    data = PeriodData(empty, empty, empty, empty)
    (admins,) = build_reports(WEEK, data, data, base_url="https://w")
    assert admins.recipient == "admins" and admins.totals is None
    assert render(admins).text.startswith("The fleet ran no GPU jobs in the week of 2026-11-30")
