"""`gpuwarden actions` against a live central service: the audit log's steps as a table,
filtered by the flags, and as CSV and JSON."""

from __future__ import annotations

import csv
import io
import json

import pytest

from service.cli.main import main
from tests.integration.actions_support import record_steps


@pytest.fixture
def base(server, tokens, engine, clock) -> list[str]:
    record_steps(engine, clock())
    return ["actions", "--url", server, "--token", tokens["reader"]]


def rows(out: str) -> list[str]:
    """The table's body lines (each holds a job id)."""
    return [line for line in out.splitlines() if "slurm:" in line or "k8s:" in line]


def test_the_table_lists_steps_newest_first_and_the_flags_filter(capsys, base) -> None:
    assert main(base) == 0
    out = capsys.readouterr().out
    assert out.lstrip().startswith("6 ladder steps, newest first")
    lines = rows(out)
    assert [next(o for o in ("skipped", "would", "failed", "reclaimed", "warned") if o in line)
            for line in lines] == ["skipped", "would", "failed", "reclaimed", "warned", "warned"]  # fmt: skip
    assert "exempt: user bo" in lines[0] and "yes" in lines[1] and "$12.50" in lines[1]
    assert "scancel 2: timed out" in lines[2] and "3. reclaim" in lines[2]
    assert main([*base, "--job", "slurm:1"]) == 0
    lines = rows(capsys.readouterr().out)
    assert len(lines) == 3 and all("slurm:1" in line for line in lines)
    assert main([*base, "--user", "bo", "--outcome", "failed"]) == 0
    (line,) = rows(capsys.readouterr().out)
    assert "slurm:2" in line
    assert main([*base, "--policy", "held-dry", "--since", "45m"]) == 0
    (line,) = rows(capsys.readouterr().out)
    assert "slurm:3" in line and "skipped" in line
    assert main([*base, "--team", "nobody"]) == 0
    assert capsys.readouterr().out.strip() == "no ladder steps match"


def test_start_end_csv_and_json(capsys, base) -> None:
    assert main([*base, "--start", "-140m", "--end", "-60m", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [a["outcome"] for a in data] == ["failed", "reclaimed"]
    assert main([*base, "--team", "nlp", "--csv"]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out, newline="")))
    assert [r["job_id"] for r in table] == ["slurm:3", "slurm:2"]


def test_a_bad_flag_value_names_the_field(capsys, base) -> None:
    assert main([*base, "--since", "forever"]) == 1
    err = capsys.readouterr().err
    assert "since" in err and "forever" in err
    with pytest.raises(SystemExit):
        main([*base, "--outcome", "cancelled"])
    assert "invalid choice: 'cancelled'" in capsys.readouterr().err
