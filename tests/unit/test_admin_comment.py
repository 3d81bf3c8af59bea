"""The AdminComment verdict line: the figures, the fix and the link in at most 250 printable
lower-case ASCII characters that sacct's parsable output and sacctmgr keep as they are."""

from __future__ import annotations

import re

from service.core.admin_comment import MAX_CHARS, verdict_line

LINK = "https://gpuwarden.example.org/jobs/slurm%3A123"
SAFE = re.compile(r"[ -~]+")  # printable ASCII


def line(**changes: object) -> str:
    fields: dict[str, object] = {
        "cost_usd": 1240.5, "held_seconds": 7200.0, "waste_usd": 608.0,
        "top_cause": "idle_held", "fix": "End the idle process or add an idle timeout",
        "link": LINK,
    }  # fmt: skip
    return verdict_line(**{**fields, **changes})  # type: ignore[arg-type]


def test_the_line_says_cost_hours_waste_cause_fix_and_link() -> None:
    assert line() == (
        "gpuwarden: $1,240.50 on 2.0 gpu-h, waste $608.00 (49%), top idle_held;"
        " fix: end the idle process or add an idle timeout;"
        " https://gpuwarden.example.org/jobs/slurm%3a123"
    )


def test_unpriced_and_unknown_parts_are_said_or_left_out() -> None:
    assert line(cost_usd=None, waste_usd=None, top_cause=None, fix=None) == (
        "gpuwarden: unpriced on 2.0 gpu-h; https://gpuwarden.example.org/jobs/slurm%3a123"
    )
    assert "(" not in line(cost_usd=0.0, waste_usd=0.0)  # no share of nothing


def test_a_long_fix_is_cut_never_the_figures_or_the_link() -> None:
    text = line(fix="Ask for fewer GPUs " * 40)
    assert len(text) == MAX_CHARS
    assert text.endswith("...; https://gpuwarden.example.org/jobs/slurm%3a123")
    assert text.startswith("gpuwarden: $1,240.50 on 2.0 gpu-h, waste $608.00 (49%)")
    # A link that leaves no room for a useful fix drops the fix, not the link.
    long_link = "https://gpuwarden.example.org/" + "x" * 200
    assert line(link=long_link).endswith("top idle_held; " + long_link)


def test_quotes_bars_backslashes_and_non_ascii_never_reach_the_text() -> None:
    text = line(fix='Use "bf16" | it\'s 2\u00d7 faster \\ → cheaper\nnow\x1b[31m', top_cause="a|b")
    assert SAFE.fullmatch(text) and text == text.lower()
    assert not set(text) & set("|\"'\\`\n")
    assert "fix: use bf16 / its 2x faster / -> cheaper now [31m;" in text
