"""A fixed run is never told the fix it applies (issue 46), on every surface that names a fix:
the job page, `gpuwarden job`, the verdict job alerts, owner notices and the ladder's steps and
reclaims carry (``verdict_by_job``), Slurm's AdminComment, and the cost report by job (which
the weekly reports' costliest jobs read); a run still going is judged by its shares so far."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import httpx
from fastapi import FastAPI

from service.cli.fleet import job_report
from service.core.admin_comment import ascii_text
from service.usecases.evaluation import verdict_by_job
from service.usecases.savings import savings_once
from tests.alerting_support import ingest
from tests.savings_support import FIXED, STARVED, add_run
from tests.support import FakeClock, auth, iso


def _job(http: httpx.Client, tokens: dict[str, str], job_id: str) -> dict[str, Any]:
    r = http.get(f"/api/v1/jobs/{job_id}", headers=auth(tokens["reader"]))
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _partly_fixed_run(http: httpx.Client, tokens: dict[str, str], job_id: str, start: datetime,
                      ended: bool) -> None:  # fmt: skip
    """A run of "bert" whose input starvation fell from the whole run to a quarter of it (3 of
    12 minutes): the fix applied, its cause still present, so its fix would be named."""
    ingest(http, tokens["agent"], start=start, count=3 * 6, metrics=STARVED)
    ingest(http, tokens["agent"], start=start + timedelta(minutes=3), count=9 * 6, metrics=FIXED)
    end = start + timedelta(minutes=12)
    body: dict[str, Any] = {"id": job_id, "user": "alice", "team": "nlp", "project": "bert",
                            "labels": {"work": "bert"}, "gpus": ["GPU-a0"],
                            "started_at": iso(start)}  # fmt: skip
    if ended:
        body["ended_at"] = iso(end)
    r = http.post("/api/v1/jobs", json=body, headers=auth(tokens["admin"]))
    assert r.status_code == 201, r.text


def _starved_fix(page: dict[str, Any]) -> str:
    return next(str(f["action"]) for f in page["recommendations"] if f["cause"] == "input_starved")


def test_an_ended_fixed_run_is_not_told_its_fix_anywhere(
    app: FastAPI, http: httpx.Client, tokens: dict[str, str], clock: FakeClock
) -> None:
    ctx = app.state.ctx
    t0 = clock() - timedelta(hours=3)
    add_run(http, tokens, "manual:bert-1", t0, 30, STARVED, None)
    _partly_fixed_run(http, tokens, "manual:bert-2", t0 + timedelta(minutes=40), ended=True)
    told = _job(http, tokens, "manual:bert-1")
    action = _starved_fix(told)
    page = _job(http, tokens, "manual:bert-2")
    s = page["savings"]
    assert (s["fix_cause"], s["fix_applied"], s["unit"]) == ("input_starved", True, "run")
    # The cause is still there (a quarter of the run): without the rule its fix would be named.
    assert page["summary"]["causes"]["input_starved"]["seconds"] > 0
    assert page["summary"]["top_cause"] == "input_starved"
    assert "input_starved" not in {f["cause"] for f in page["recommendations"]}
    # gpuwarden job: neither the recommendations nor the top cause's fallback name it.
    text = job_report(page, now=clock())
    assert action not in text and "its fix is already applied by this run" in text
    assert action in job_report(told, now=clock())
    # Job alerts, owner notices, the ladder's steps and reclaims: the verdict they carry.
    verdicts = verdict_by_job(ctx, {"manual:bert-1", "manual:bert-2"}, clock())
    assert verdicts["manual:bert-1"] is not None and verdicts["manual:bert-1"].fix == action
    assert verdicts["manual:bert-2"] is not None and verdicts["manual:bert-2"].fix != action
    # Slurm's AdminComment.
    said = {}
    for job_id in ("manual:bert-1", "manual:bert-2"):
        r = http.get(f"/api/v1/verdicts/{job_id}", headers=auth(tokens["reader"]))
        assert r.status_code == 200, r.text
        said[job_id] = r.text
    short = ascii_text(action).lower()[:12]
    assert short in said["manual:bert-1"] and short not in said["manual:bert-2"]
    # The cost report by job (and the weekly reports' costliest jobs), from the stored savings.
    savings_once(ctx)
    window = {"start": iso(t0 - timedelta(days=1)), "end": iso(clock()), "group_by": "job"}
    r = http.get("/api/v1/reports/cost", params=window, headers=auth(tokens["reader"]))
    assert r.status_code == 200, r.text
    fixes = {x["key"]: {f["cause"] for f in x["fixes"]} for x in r.json()["rows"]}
    assert "input_starved" in fixes["manual:bert-1"]
    assert "input_starved" not in fixes["manual:bert-2"]


def test_a_running_fixed_run_is_not_told_its_fix(
    app: FastAPI, http: httpx.Client, tokens: dict[str, str], clock: FakeClock
) -> None:
    add_run(http, tokens, "manual:bert-1", clock() - timedelta(hours=3), 30, STARVED, None)
    _partly_fixed_run(http, tokens, "manual:bert-2", clock() - timedelta(minutes=12), ended=False)
    action = _starved_fix(_job(http, tokens, "manual:bert-1"))
    page = _job(http, tokens, "manual:bert-2")
    s = page["savings"]
    assert (s["verdict"], s["reason"]) == ("not_compared", "the later run has not ended")
    assert (s["fix_cause"], s["fix_applied"]) == ("input_starved", True)
    assert "input_starved" not in {f["cause"] for f in page["recommendations"]}
    v = verdict_by_job(app.state.ctx, {"manual:bert-2"}, clock())["manual:bert-2"]
    assert v is not None and v.fix != action


def test_a_run_of_other_work_is_still_told_the_fix(
    http: httpx.Client, tokens: dict[str, str], clock: FakeClock
) -> None:
    t0 = clock() - timedelta(hours=3)
    add_run(http, tokens, "manual:bert-1", t0, 30, STARVED, None)
    # Ten times as long without progress: other work, so nothing says the fix was applied.
    add_run(http, tokens, "manual:bert-2", t0 + timedelta(minutes=40), 120, STARVED, None)
    page = _job(http, tokens, "manual:bert-2")
    assert page["savings"]["verdict"] == "not_compared"
    assert page["savings"]["fix_applied"] is False
    assert "input_starved" in {f["cause"] for f in page["recommendations"]}
