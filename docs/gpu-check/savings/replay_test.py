"""The savings check recorded on a real GPU (docs/gpu-check/savings/) replayed through a real
central service: every agent batch, job registration (with its job key's labels), progress post
and job end at its recorded time; on SQLite and PostgreSQL.

For each pair (a wasteful run, then the same job key with the fix GPU Warden named) the realised
saving, from the GPU-seconds per unit of work the central records, is within 5 points of the one
the runs' own timers measured, and the wasteful run's promise for that fix within 10 points.
"""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.usecases.upkeep import observed_jobs_once, rollup_once
from tests.conftest import make_token
from tests.support import FakeClock

SAVINGS = Path(__file__).resolve().parents[2] / "docs" / "gpu-check" / "savings"
NODE = "h200-check"
REALISED_TOLERANCE = 0.05
PROMISE_TOLERANCE = 0.10
# Until the device run is recorded here (docs/gpu-check/savings/README.md) there is nothing to
# replay; once it is, every test below runs.
pytestmark = pytest.mark.skipif(
    not (SAVINGS / "savings_runs.json").exists(), reason="the savings check is not recorded yet"
)


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _recorded() -> dict[str, Any]:
    runs: dict[str, Any] = json.loads((SAVINGS / "savings_runs.json").read_text())
    return runs


def _progress_posts() -> list[dict[str, Any]]:
    lines = (SAVINGS / "savings_progress_posts.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _arrivals(lines: list[str]) -> list[datetime]:
    """When each recorded batch reached the central (recorded by the proxy; else, for a
    recording without them, a second after its last sample)."""
    path = SAVINGS / "savings_batch_arrivals.jsonl"
    if path.exists():
        got = [json.loads(a)["received"] for a in path.read_text().splitlines()]
        return [datetime.fromtimestamp(t, UTC) for t in got]
    return [max(_at(s["ts"]) for s in json.loads(line)["samples"]) + timedelta(seconds=1)
            for line in lines]  # fmt: skip


def _replay(
    app: Any, http: httpx.Client, engine: Any, clock: FakeClock, runs: dict[str, Any]
) -> dict[str, str]:
    """Send every recorded registration, agent batch, progress post and job end in the order
    and at the times they reached the central on the device, then roll up; the reader's
    headers."""
    agent = {"Authorization": f"Bearer {make_token(engine, 'agent', NODE)}"}
    lines = (SAVINGS / "savings_agent_output.jsonl").read_text().splitlines()
    events: list[tuple[datetime, int, Any]] = [
        (_at(r["body"]["started_at"]), 0, r["body"]) for r in runs["registrations"]
    ]
    events += [(at, 1, line) for at, line in zip(_arrivals(lines), lines, strict=True)]
    events += [
        (datetime.fromtimestamp(p["received"], UTC), 2, p)
        for p in _progress_posts()
        if p["status"] < 300
    ]
    events += [(_at(e["body"]["ended_at"]), 3, e) for e in runs["ends"]]
    events.sort(key=lambda e: (e[0], e[1]))
    for at, kind, what in events:
        clock.set(at)
        if kind == 0:
            r = http.post("/api/v1/jobs", json=what, headers=agent)
            assert r.status_code == 201, r.text
        elif kind == 1:
            r = http.post(
                "/api/v1/ingest",
                content=gzip.compress(what.encode()),
                headers={**agent, "Content-Encoding": "gzip", "Content-Type": "application/json"},
            )
            assert r.status_code == 200, r.text
        elif kind == 2:
            r = http.post(what["path"], json=what["body"], headers=agent)
            assert r.status_code == what["status"], r.text
        else:
            r = http.patch(f"/api/v1/jobs/{what['job']}", json=what["body"], headers=agent)
            assert r.status_code == 200, r.text
    clock.set(events[-1][0] + timedelta(minutes=10))
    observed_jobs_once(app.state.ctx)
    rollup_once(app.state.ctx)
    return {"Authorization": f"Bearer {make_token(engine, 'reader')}"}


def realised_fraction_from_pages(before: dict[str, Any], after: dict[str, Any]) -> float:
    """1 - GPU-seconds per unit of work after / before, from two job pages, as the savings
    contract defines it: per unit of reported progress, else per run (a fixed-size job).

    Where the real field plugs in: once GET /jobs/{id} carries ``savings`` (h-savings), the
    later run's ``savings["realised_fraction"]`` is this number and the test reads it."""
    per_before, per_after = before["gpu_seconds_per_unit"], after["gpu_seconds_per_unit"]
    if per_before is not None and per_after is not None:
        return 1.0 - float(per_after) / float(per_before)
    assert before["unit_of_work"] == after["unit_of_work"] == "run", (before, after)
    # held_seconds is the job's GPU-seconds (summed over its GPUs): the whole run's
    return 1.0 - float(after["summary"]["held_seconds"]) / float(before["summary"]["held_seconds"])


def _measured(before: dict[str, Any], after: dict[str, Any]) -> float:
    """1 - the runs' own time per unit after / before (steps, or the whole run)."""
    key = "seconds_per_run" if before["kind"] == "fixed" else "seconds_per_step"
    return 1.0 - float(after[key]) / float(before[key])


def _promised(before: dict[str, Any], cause: str, unit: str) -> float:
    """The wasteful job's promise for its cause's fix, as a fraction of its unit of work: the
    fix's share of the cause's time (the steps run in it), or of the whole run's cost."""
    (fix,) = [f for f in before["recommendations"] if f["cause"] == cause]
    if unit == "run":
        return float(fix["saving_usd"]) / float(before["summary"]["cost_usd"])
    return float(fix["saving_fraction"])


@pytest.fixture
def replayed(app: Any, http: httpx.Client, engine: Any, clock: FakeClock) -> dict[str, Any]:
    """GET /jobs/{id} of every recorded run's job after the replay, by job id."""
    runs = _recorded()
    reader = _replay(app, http, engine, clock, runs)
    pages = {}
    for r in runs["runs"]:
        got = http.get(f"/api/v1/jobs/{r['job']}", headers=reader)
        assert got.status_code == 200, got.text
        pages[r["job"]] = got.json()
    return pages


def _pairs() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    by = {(r["pair"], r["phase"]): r for r in _recorded()["runs"]}
    return [(b, by[(pair, "after")]) for (pair, phase), b in by.items() if phase == "before"]


def test_every_pair_was_recorded_with_one_job_key_and_progress_where_it_counts() -> None:
    runs = _recorded()
    pairs = _pairs()
    causes = {b["cause"] for b, _ in pairs if b["kind"] == "progress"}
    assert causes == {
        "input_starved",
        "compute_no_tensor",
        "launch_bound",
        "transfer_bound",
        "memory_bound",
    }
    assert sum(b["kind"] == "fixed" for b, _ in pairs) == 1
    assert sum(b["kind"] == "upstream" for b, _ in pairs) >= 2
    labels = {r["body"]["id"]: r["body"]["labels"] for r in runs["registrations"]}
    posted = {p["path"].split("/jobs/")[1].removesuffix("/progress") for p in _progress_posts()}
    for before, after in pairs:
        assert labels[before["job"]] == labels[after["job"]], before["pair"]
        reports = before["kind"] != "fixed"
        assert (before["job"] in posted, after["job"] in posted) == (reports, reports)


def test_realised_savings_match_the_runs_own_timers_and_the_promises(
    replayed: dict[str, Any],
) -> None:
    recorded = _recorded()["jobs"]
    for before, after in _pairs():
        page_b, page_a = replayed[before["job"]], replayed[after["job"]]
        unit = "run" if before["kind"] == "fixed" else "step"
        assert page_a["unit_of_work"] == unit, (before["pair"], page_a["unit_of_work_text"])
        realised = realised_fraction_from_pages(page_b, page_a)
        # The replay stores what the device's central stored.
        on_device = realised_fraction_from_pages(recorded[before["job"]], recorded[after["job"]])
        assert realised == pytest.approx(on_device, abs=0.01), before["pair"]
        measured = _measured(before, after)
        assert abs(realised - measured) <= REALISED_TOLERANCE, (before["pair"], realised, measured)
        promised = _promised(page_b, before["cause"], unit)
        assert abs(promised - measured) <= PROMISE_TOLERANCE, (before["pair"], promised, measured)
