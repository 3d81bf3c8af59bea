"""What ``--help`` and job headings say: counts derived, flags that apply, no jargon."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from service.cli.fleet import job_report
from service.cli.main import build_parser
from service.collectors.scenarios import SCENARIOS
from service.vocabulary import JOB_SOURCE_TEXT

ROOT = Path(__file__).resolve().parents[2]


def help_of(command: str) -> str:
    parser = build_parser()
    (sub_action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    sub = sub_action.choices[command]
    return " ".join(sub.format_help().split())


def test_demo_help_counts_the_scenarios_there_are() -> None:
    text = help_of("demo")
    assert f"the {len(SCENARIOS)} scenarios" in text


def test_only_the_agent_takes_a_central_url_and_agent_token() -> None:
    for flag in ("--central-url", "--agent-token"):
        assert flag in help_of("agent")
        assert flag not in help_of("up") and flag not in help_of("demo")


def test_a_job_heading_says_in_words_how_the_job_became_known() -> None:
    job = {
        "id": "slurm:7",
        "user": "alice",
        "source": "observed",
        "started_at": "2026-12-03T08:00:00Z",
        "ended_at": "2026-12-03T09:00:00Z",
        "gpus": [],
        "summary": {"held_seconds": 0, "allocated_seconds": 0, "cost_usd": 0,
                    "waste_usd": 0, "idle_usd": 0, "fixable_usd": 0},
    }  # fmt: skip
    from datetime import UTC, datetime

    heading = job_report(job, now=datetime(2026, 12, 3, 10, tzinfo=UTC)).splitlines()[0]
    assert heading == f"Job slurm:7 (user alice), {JOB_SOURCE_TEXT['observed']}"
    assert "from observed" not in heading


def test_the_console_says_the_same_words() -> None:
    js = (ROOT / "service/api/static/console/console.js").read_text()
    found = re.search(r"const JOB_SOURCE_TEXT = \{(.*?)\};", js)
    assert found is not None
    pairs = dict(re.findall(r'(\w+): "([^"]*)"', found.group(1)))
    assert pairs == JOB_SOURCE_TEXT
    assert "from ${job.source}" not in js
