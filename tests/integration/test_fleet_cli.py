"""`gpuwarden gpus` and `gpuwarden job` against a live central service."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from service.cli import fleet
from service.cli.main import main
from service.usecases.upkeep import rollup_once
from tests.support import FakeClock, iso, make_batch


@pytest.fixture
def fleet_data(app, http, tokens, clock: FakeClock) -> None:
    start = clock() - timedelta(minutes=10)
    held = {"sm_active": 0.0, "fb_used_bytes": 20 * 2**30}
    busy = {"sm_active": 0.9, "tensor_active": 0.8, "fb_used_bytes": 40 * 2**30}
    agent = {"Authorization": f"Bearer {tokens['agent']}"}
    for uuid, metrics in (("GPU-a0", held), ("GPU-a1", busy)):
        batch = make_batch(start=start, count=60, gpu_uuids=(uuid,), metrics=metrics)
        batch["gpus"][0]["index"] = int(uuid[-1])
        http.post("/api/v1/ingest", json=batch, headers=agent).raise_for_status()
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    for job, team, gpu in (("slurm:1", "vision", "GPU-a0"), ("slurm:2", "nlp", "GPU-a1")):
        body = {"id": job, "user": "alice", "team": team, "gpus": [gpu], "started_at": iso(start)}
        http.post("/api/v1/jobs", json=body, headers=admin).raise_for_status()
    rollup_once(app.state.ctx)


def test_gpus_lists_every_gpu_worst_first_and_filters(
    capsys, server, tokens, fleet_data, monkeypatch
):
    monkeypatch.setattr(fleet, "utc_now", lambda: FakeClock()())
    base = ["gpus", "--url", server, "--token", tokens["reader"]]
    assert main(base) == 0
    out = capsys.readouterr().out
    held, busy = out.index("slurm:1"), out.index("slurm:2")
    assert held < busy  # the idle-held GPU wastes more, so it comes first
    assert "idle-held" in out and "20/80 GiB" in out and "alice" in out
    assert main([*base, "--team", "nlp"]) == 0
    out = capsys.readouterr().out
    assert "slurm:2" in out and "slurm:1" not in out
    assert main([*base, "--state", "idle-held"]) == 0
    out = capsys.readouterr().out
    assert "slurm:1" in out and "slurm:2" not in out
    assert main([*base, "--cause", "compute_tensor"]) == 0
    out = capsys.readouterr().out
    assert "slurm:2" in out and "slurm:1" not in out and "working" in out


def _headline_usd(out: str, figure: str) -> float:
    found = re.search(rf"{figure} \$([0-9.,]+)", out)
    assert found is not None, out
    return float(found.group(1).replace(",", ""))


def test_gpus_headline_follows_its_filters(capsys, server, tokens, fleet_data, monkeypatch):
    base = ["gpus", "--url", server, "--token", tokens["reader"]]
    assert main(base) == 0
    fleet_cost = _headline_usd(capsys.readouterr().out, "cost")
    assert main([*base, "--state", "idle-held"]) == 0
    out = capsys.readouterr().out
    held_row = next(line for line in out.splitlines() if "slurm:1" in line)
    held_usd = float(held_row.rsplit("$", 1)[1].strip(" │|").replace(",", ""))
    assert out.lstrip().startswith("1 GPU (state idle-held)")
    # The headline is the shown GPU's only: its waste (all of it idle), and its cost less than
    # the fleet's, whose other GPU, working, costs too.
    assert _headline_usd(out, "waste") == pytest.approx(held_usd, abs=0.01)
    assert _headline_usd(out, "idle") == pytest.approx(held_usd, abs=0.01)
    assert _headline_usd(out, "cost") < fleet_cost


@pytest.mark.parametrize(
    ("flag", "value", "nearest"), [("--node", "node-b", "node-a"), ("--team", "visoin", "vision")]
)
def test_gpus_names_the_nearest_of_an_unknown_node_or_team(
    capsys, server, tokens, fleet_data, flag: str, value: str, nearest: str
):
    assert main(["gpus", "--url", server, "--token", tokens["reader"], flag, value]) != 0
    captured = capsys.readouterr()
    assert f"did you mean '{nearest}'?" in captured.err and value in captured.err
    assert captured.out == ""


def test_gpus_sort_by_cost(capsys, server, tokens, fleet_data):
    assert main(["gpus", "--url", server, "--token", tokens["reader"], "--sort", "cost"]) == 0
    out = capsys.readouterr().out
    assert "$ waste today" in out and "waste $" in out and "(estimated)" in out


def test_gpus_watch_refreshes_until_ctrl_c(capsys, server, tokens, fleet_data, monkeypatch):
    calls = []

    def sleep(seconds: float) -> None:
        calls.append(seconds)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(fleet, "sleep", sleep)
    code = main(["gpus", "--url", server, "--token", tokens["reader"], "--watch", "1"])
    assert code == 130 and calls == [1.0, 1.0]
    assert "slurm:1" in capsys.readouterr().out


def test_job_prints_a_plain_report(capsys, server, tokens, fleet_data):
    assert main(["job", "slurm:1", "--url", server, "--token", tokens["reader"]]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Job slurm:1 (user alice, team vision)")
    assert "GPU-a0 on node-a" in out and "Efficiency" in out
    assert "Time and dollars by cause (cost, waste):" in out and "idle_held" in out
    assert "Waste: $" in out and "(estimated)" in out and "wasted" not in out
    assert "Recommendations (together they save $" in out
    assert "idle_held: end the idle process" in out and "assuming nothing ran" in out
    assert main(["job", "slurm:404", "--url", server, "--token", tokens["reader"]]) == 1
    err = capsys.readouterr().err
    assert "(404)" in err and "slurm:404" in err and "{" not in err


def test_a_bare_job_number_is_answered_with_the_job_it_means(capsys, server, tokens, fleet_data):
    assert main(["job", "1", "--url", server, "--token", tokens["reader"]]) == 1
    err = capsys.readouterr().err
    assert "no job '1'; did you mean slurm:1? (gpuwarden job slurm:1)" in err
    assert main(["job", "404", "--url", server, "--token", tokens["reader"]]) == 1
    err = capsys.readouterr().err
    assert "(404)" in err and "did you mean" not in err
