"""The audit log's outcomes are declared once (service.vocabulary); the console's copy and the
CLI's choices are the same list."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from service.cli.main import build_parser
from service.vocabulary import ACTION_OUTCOMES

CONSOLE_JS = Path(__file__).resolve().parents[2] / "service/api/static/console/console.js"


def test_the_console_lists_the_same_outcomes() -> None:
    found = re.search(r"const ACTION_OUTCOMES = (\[.*?\]);", CONSOLE_JS.read_text())
    assert found is not None
    assert tuple(json.loads(found.group(1))) == ACTION_OUTCOMES


def test_the_cli_accepts_exactly_the_outcomes(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    for outcome in ACTION_OUTCOMES:
        assert parser.parse_args(["actions", "--outcome", outcome]).outcome == outcome
    with pytest.raises(SystemExit):
        parser.parse_args(["actions", "--help"])
    assert ", ".join(ACTION_OUTCOMES) in " ".join(capsys.readouterr().out.split())
