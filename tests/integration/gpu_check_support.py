"""The replay of a recorded gpu-check run through the service."""

from __future__ import annotations

import gzip
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from service.usecases.upkeep import observed_jobs_once, rollup_once
from tests.conftest import make_token
from tests.support import FakeClock

NODE = "h200-check"


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _replay(
    app: Any,
    http: httpx.Client,
    engine: Any,
    clock: FakeClock,
    record: Path,
    jobs: dict[str, dict[str, Any]],
) -> dict[str, str]:
    """Post every recorded batch as it arrived, registering and ending ``jobs`` (id -> the
    recorded job) at their recorded times as the prolog and epilog did, then roll up; returns
    the reader's headers."""
    agent = {"Authorization": f"Bearer {make_token(engine, 'agent', NODE)}"}
    starts = sorted((_at(j["gpus"][0]["started_at"]), job_id) for job_id, j in jobs.items())
    ends = sorted((_at(j["gpus"][0]["ended_at"]), job_id) for job_id, j in jobs.items())
    last = None
    for line in record.read_text().splitlines():
        batch = json.loads(line)
        last = max(_at(s["ts"]) for s in batch["samples"])
        while starts and starts[0][0] <= last:
            at, job_id = starts.pop(0)
            clock.set(at)
            (interval,) = jobs[job_id]["gpus"]
            body = {
                "id": job_id,
                "user": jobs[job_id]["user"],
                "team": jobs[job_id]["team"],
                "gpus": [interval["gpu_uuid"]],
                "started_at": interval["started_at"],
            }
            r = http.post("/api/v1/jobs", json=body, headers=agent)
            assert r.status_code == 201, r.text
        clock.set(last + timedelta(seconds=1))  # the service's clock as the batch arrived
        r = http.post(
            "/api/v1/ingest",
            content=gzip.compress(line.encode()),
            headers={**agent, "Content-Encoding": "gzip", "Content-Type": "application/json"},
        )
        assert r.status_code == 200, r.text
        while ends and ends[0][0] <= last:
            at, job_id = ends.pop(0)
            r = http.patch(
                f"/api/v1/jobs/{job_id}", json={"ended_at": at.isoformat()}, headers=agent
            )
            assert r.status_code == 200, r.text
    assert last is not None and not starts and not ends
    clock.set(last + timedelta(minutes=10))
    observed_jobs_once(app.state.ctx)
    rollup_once(app.state.ctx)
    return {"Authorization": f"Bearer {make_token(engine, 'reader')}"}
