"""The real agent's batches from the useful-work device run (an H100, docs/gpu-check/useful/)
posted to a real central as they arrived, with the central's own useful-work job run after each
batch as its scheduler would, on SQLite and PostgreSQL: after the hold, at least 95% of each
keep-alive loop's and the hung kernel's stored GPU-seconds are sham or hung (the hung kernel's
hung), and at most 1% of each real workload's. The jobs are the ones the central observed from
the processes' SLURM_JOB_ID, as in the device run: the hung kernel's job took the GPU seconds
after the first job's processes left, while that job's observed interval was still open."""

from __future__ import annotations

import gzip
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, select

from service.core.diagnosis import Cause
from service.db.schema import samples
from service.settings import Settings
from service.usecases.useful_work import judge_once
from tests.conftest import make_token
from tests.support import FakeClock

USEFUL = Path(__file__).resolve().parents[2] / "docs" / "gpu-check" / "useful"
# The first device run (hold 12 s, every workload) and the two at a 200 s hold (the waste designs).
RUNS = [USEFUL, *sorted((USEFUL / "hold200").glob("run*"))]
WASTE = {"pid_matmul": Cause.SHAM, "relu_bursts": Cause.SHAM, "spin_sleep": Cause.SHAM,
         "hung_flag": Cause.HUNG}  # fmt: skip
REAL = ("starved_training", "inference_light", "checkpoint_write", "eval_loop", "notebook_cell")


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.parametrize("folder", RUNS, ids=lambda p: p.name)
def test_the_centrals_job_calls_the_recorded_loops_sham_the_hung_kernel_hung_and_no_real_work(
    app: Any,
    http: httpx.Client,
    engine: Engine,
    clock: FakeClock,
    settings: Settings,
    folder: Path,
) -> None:
    result = json.loads((folder / "useful_result.json").read_text())
    hold = float(result["hold_seconds"])
    settings.useful_work_hold_minutes = hold / 60.0
    agent = {
        "Authorization": f"Bearer {make_token(engine, 'agent', 'useful-check')}",
        "Content-Encoding": "gzip",
        "Content-Type": "application/json",
    }
    for line in (folder / "useful_agent_output.jsonl").read_text().splitlines():
        last = max(_at(s["ts"]) for s in json.loads(line)["samples"])
        clock.set(last + timedelta(seconds=1))  # the batch arrives; the job runs
        r = http.post("/api/v1/ingest", content=gzip.compress(line.encode()), headers=agent)
        assert r.status_code == 200, r.text
        judge_once(engine, settings, now=clock())
    clock.set(clock() + timedelta(seconds=30))  # the scheduler's next run after the last batch
    judge_once(engine, settings, now=clock())
    with engine.connect() as conn:
        stored = [
            (ts.timestamp(), c) for ts, c in conn.execute(select(samples.c.ts, samples.c.cause))
        ]
    table: dict[str, dict[Cause | None, int]] = {}
    for ph in result["phases"]:
        lo, hi = ph["start"] + hold, ph["end"] - 0.5
        counts: dict[Cause | None, int] = {}
        for ts, c in stored:
            if lo <= ts <= hi:
                cause = Cause(c) if c is not None else None
                counts[cause] = counts.get(cause, 0) + 1
        table[ph["phase"]] = counts
    assert set(table) <= set(WASTE) | set(REAL) and set(table) & set(WASTE)
    for phase, want in ((p, w) for p, w in WASTE.items() if p in table):
        n = sum(table[phase].values())
        assert n >= 0.8 * (result["waste_seconds"] - hold), (phase, table[phase])
        useless = table[phase].get(Cause.SHAM, 0) + table[phase].get(Cause.HUNG, 0)
        assert useless >= 0.95 * n, (phase, table[phase])
        assert table[phase].get(want, 0) >= 0.95 * n, (phase, table[phase])
    for phase in (p for p in REAL if p in table):
        n = sum(table[phase].values())
        assert n >= 0.8 * (result["real_seconds"] - hold), (phase, table[phase])
        useless = table[phase].get(Cause.SHAM, 0) + table[phase].get(Cause.HUNG, 0)
        assert useless <= 0.01 * n, (phase, table[phase])
