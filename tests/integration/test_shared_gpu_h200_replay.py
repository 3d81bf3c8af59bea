"""The real H200 capture of three jobs on one GPU (docs/gpu-check/shared/) through the central
service: ingested with its processes (the jobs are observed from them), rolled up, reported.
Each job's row matches what it did and the jobs' dollars add up to the GPU's to the cent."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, insert

from service.context import ServiceContext
from service.costs.integrals import Thresholds
from service.costs.tenants import SplitRule
from service.db import rollup_repo
from service.db.schema import prices
from service.settings import Settings
from service.usecases import ingest as ingest_service
from service.usecases.costing.cost_report import cost_report
from service.wire import IngestBatch
from tests.support import FakeClock

CAPTURE = Path(__file__).parents[2] / "docs/gpu-check/shared/tenants_samples.jsonl"
PRICE = 3.72


def _batch() -> tuple[dict[str, Any], datetime, datetime]:
    lines = [json.loads(x) for x in CAPTURE.read_text().splitlines()]
    meta, recs = lines[0]["meta"], lines[1:]
    (dev,) = meta["devices"]
    samples, procs = [], []
    for r in recs:
        samples.append(
            {"gpu_uuid": dev["uuid"], "ts": r["ts"], "metrics": r["reading"][0]["metrics"]}
        )
        util = {u["pid"]: u for u in r["proc_util"]["rows"]}
        for p in r["running"]["rows"]:
            u = util.get(p["pid"])  # absent from NVML's samples: ran no kernel
            procs.append(
                {
                    "gpu_uuid": dev["uuid"],
                    "ts": r["ts"],
                    "pid": p["pid"],
                    "fb_used_bytes": p["used_bytes"],
                    "job_id": f"slurm:{p['job']}",
                    "sm_util": u["sm"] / 100 if u else 0.0,
                    "mem_util": u["mem"] / 100 if u else 0.0,
                }
            )
    batch = {
        "node": {"hostname": "h200", "labels": {}},
        "gpus": [
            {
                "uuid": dev["uuid"],
                "index": 0,
                "model": dev["model"],
                "fb_total_bytes": dev["fb_total_bytes"],
            }
        ],
        "samples": samples,
        "processes": procs,
    }
    first = datetime.fromisoformat(recs[0]["ts"])
    last = datetime.fromisoformat(recs[-1]["ts"])
    return batch, first, last


@pytest.mark.parametrize("rule", [SplitRule.EQUAL, SplitRule.ACTIVITY])
def test_h200_capture_through_the_central(
    engine: Engine, clock: FakeClock, settings: Settings, rule: SplitRule
) -> None:
    batch, first, last = _batch()
    clock.now = last + timedelta(minutes=10)
    ctx = ServiceContext(settings=settings, engine=engine, clock=clock)
    ingest_service.ingest(ctx, IngestBatch.model_validate(batch), token_node="h200")
    with engine.begin() as conn:
        conn.execute(
            insert(prices).values(
                model_pattern="*", usd_per_gpu_hour=PRICE, effective_from=first - timedelta(days=1)
            )
        )
    while True:
        with engine.begin() as conn:
            if rollup_repo.process_dirty(conn, thresholds=Thresholds(), split_rule=rule) == 0:
                break
    settings.cost_split_rule = rule.value
    start = first.replace(second=0, microsecond=0)
    end = last + timedelta(minutes=2)
    with engine.connect() as conn:
        by_job = cost_report(
            conn, settings=settings, start=start, end=end, now=clock(), group_by="job"
        )
        by_gpu = cost_report(
            conn, settings=settings, start=start, end=end, now=clock(), group_by="gpu"
        )
    rows = {r["key"]: r for r in by_job["rows"]}
    assert {"slurm:9101", "slurm:9102", "slurm:9103"} <= set(rows)  # observed from the processes
    gpu_cost = by_gpu["totals"]["cost_usd"]
    assert round(sum(r["cost_usd"] for r in rows.values()), 2) == round(gpu_cost, 2)
    busy, starved, idle = rows["slurm:9101"], rows["slurm:9102"], rows["slurm:9103"]
    assert busy["causes"]["compute_tensor"]["seconds"] >= 0.95 * busy["allocated_seconds"]
    assert starved["causes"]["compute_tensor"]["seconds"] > 0

    def covered_usd(row: dict[str, Any]) -> float:
        """The dollars of the sampled time: the cost less its nodata (the minute after the
        last sample, still held by the open jobs) and lost time."""
        return float(sum(c["usd"] for c in row["causes"].values()))

    for row in rows.values():
        assert row["cost_usd"] == pytest.approx(covered_usd(row) + row["nodata_usd"])
    if rule is SplitRule.EQUAL:
        # the notebook: a third of the GPU's time, nothing of it running
        assert idle["idle_held_seconds"] >= 0.95 * idle["allocated_seconds"] > 30
        assert idle["idle_usd"] == pytest.approx(covered_usd(idle), rel=0.05)
        assert idle["waste_usd"] == pytest.approx(idle["idle_usd"], rel=0.05)
        assert busy["idle_seconds"] == 0
    else:
        # busy time by SM share: the notebook ran nothing and pays (almost) nothing of it
        gpu_covered = covered_usd(by_gpu["totals"])
        assert covered_usd(idle) <= 0.03 * gpu_covered
        assert covered_usd(busy) > covered_usd(starved) > covered_usd(idle)
