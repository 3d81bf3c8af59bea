"""``gpuwarden report cost`` against a live central service: table, CSV, JSON and errors."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import Engine

from service.cli.main import main
from tests.integration.cost_data import roll_up, store_series, worked_example_metrics
from tests.support import FakeClock, iso

T0 = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)


@pytest.fixture
def jobs_present(engine: Engine, clock: FakeClock, http: httpx.Client, tokens) -> None:
    store_series(engine, clock, uuid="GPU-a0", start=T0, metrics=worked_example_metrics())
    store_series(
        engine,
        clock,
        uuid="GPU-a1",
        start=T0,
        index=1,
        metrics=[{"sm_active": 0.9, "tensor_active": 0.6}] * 360,
    )
    roll_up(engine)
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    http.put(
        "/api/v1/prices",
        json=[
            {
                "model_pattern": "*H100*",
                "usd_per_gpu_hour": 4.0,
                "effective_from": "2026-01-01T00:00:00Z",
            }
        ],
        headers=admin,
    ).raise_for_status()
    for job_id, team, gpu in (("slurm:1", "vision", "GPU-a0"), ("slurm:2", "nlp", "GPU-a1")):
        http.post(
            "/api/v1/jobs",
            json={
                "id": job_id,
                "user": "alice",
                "team": team,
                "gpus": [gpu],
                "started_at": iso(T0),
                "ended_at": iso(T0 + timedelta(hours=1)),
            },
            headers=admin,
        ).raise_for_status()


def run(capsys, server: str, token: str, *extra: str) -> tuple[int, str, str]:
    code = main(
        [
            "report",
            "cost",
            "--url",
            server,
            "--token",
            token,
            "--start",
            iso(T0),
            "--end",
            iso(T0 + timedelta(hours=1)),
            *extra,
        ]
    )
    out = capsys.readouterr()
    return code, out.out, out.err


def test_table_shows_the_most_wasteful_job_first(capsys, server: str, tokens, jobs_present):
    code, out, _ = run(capsys, server, tokens["reader"])
    assert code == 0
    assert out.index("slurm:1") < out.index("slurm:2")  # $2.00 of waste before $0.00
    assert "$2.00" in out and "TOTAL" in out and "tags" not in out
    # The top cause per job with the waste in it, and the time by cause of the totals.
    assert "idle_held 50% $2.00" in out
    assert "time by cause: compute_tensor 75% ($6.00), idle_held 25% ($2.00)" in out
    # The fix that saves the most per row, and the totals' waste and fixes.
    assert "$2.00 (idle_held)" in out
    assert "waste $2.00 (0.50 GPU-h) = idle $2.00 + fixable $0.00 (estimated)" in out
    assert "top fixes: idle_held $2.00 (end the idle process" in out


def test_group_by_team_csv_and_json(capsys, server: str, tokens, jobs_present):
    code, out, _ = run(capsys, server, tokens["reader"], "--group-by", "team", "--csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["team"] for r in rows] == ["vision", "nlp", "__total__"]
    assert float(rows[-1]["cost_usd"]) == pytest.approx(8.0)
    assert float(rows[0]["idle_held_seconds"]) == pytest.approx(1800)
    assert float(rows[0]["idle_held_usd"]) == pytest.approx(2.0)
    assert rows[0]["top_cause"] == "idle_held"
    assert float(rows[0]["waste_usd"]) == pytest.approx(2.0)
    assert rows[0]["top_fix"] == "idle_held"
    assert float(rows[0]["top_fix_saving_usd"]) == pytest.approx(2.0)
    code, out, _ = run(capsys, server, tokens["reader"], "--group-by", "team", "--json")
    data = json.loads(out)
    assert data["totals"]["waste_usd"] == pytest.approx(2.0)


def test_errors_are_reported_not_raised(capsys, server: str, tokens):
    code, _, err = run(capsys, server, "wrong-token")
    assert code == 1 and "401" in err
    code, _, err = (
        main(["report", "cost", "--url", server, "--token", tokens["reader"], "--since", "soon"]),
        "",
        capsys.readouterr().err,
    )
    assert code == 2 and "--since" in err
