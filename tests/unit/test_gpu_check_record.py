"""The recorded H200 run (docs/gpu-check) satisfies the wire contract and shows the three phases."""

from __future__ import annotations

import json
import statistics
from datetime import datetime
from pathlib import Path

from service.wire import IngestBatch

DIR = Path(__file__).resolve().parents[2] / "docs" / "gpu-check"


def test_recorded_agent_output_is_valid_wire_format_and_the_phases_are_plain():
    batches = [
        IngestBatch.model_validate_json(line)
        for line in (DIR / "agent_output.jsonl").read_text().splitlines()
    ]
    assert len(batches) > 60
    phases = json.loads((DIR / "result.json").read_text())["workload"]["phases"]
    med: dict[str, dict[str, float]] = {}
    for ph in phases:
        rows = [
            s.metrics
            for b in batches
            for s in b.samples
            if ph["start"] + 2 <= s.ts.timestamp() <= ph["end"]
        ]
        med[ph["phase"]] = {
            k: statistics.median(getattr(m, k) for m in rows)
            for k in ("sm_active", "tensor_active", "dram_active", "fb_used_bytes")
        }
        jobs = {
            (p.job_id, p.user)
            for b in batches
            for p in b.processes
            if ph["start"] + 2 <= p.ts.timestamp() <= ph["end"]
        }
        assert jobs == {("slurm:4242", "alice")}
    mm, ew, idle = med["matmul_bf16"], med["elementwise_memory_bound"], med["idle_holding_memory"]
    assert mm["sm_active"] > 0.9 and mm["tensor_active"] > 0.9
    assert ew["dram_active"] > 0.8 and ew["tensor_active"] < 0.01
    assert idle["sm_active"] < 0.01 and idle["fb_used_bytes"] > 8e9
    assert isinstance(batches[0].samples[0].ts, datetime)
