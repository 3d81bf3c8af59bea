"""The terminal views: `gpuwarden gpus` rows worst first, and `gpuwarden job`'s plain report."""

from __future__ import annotations

from argparse import Namespace
from datetime import UTC, datetime, timedelta

from service.cli.fleet import fleet_rows, fleet_title, job_report

NOW = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)
GIB = 1024**3


def gpu(uuid: str, index: int, state: str, cause: str | None, **extra: object) -> dict[str, object]:
    return {
        "uuid": uuid,
        "index": index,
        "node": "node-a",
        "model": "NVIDIA H100 80GB HBM3",
        "fb_total_bytes": 80 * GIB,
        "last_seen_at": (NOW - timedelta(seconds=5)).isoformat(),
        "lost": False,
        "latest": {"fb_used_bytes": 20 * GIB},
        "activity": 0.9 if cause == "compute_tensor" else 0.0,
        "cause": cause,
        "state": state,
        "job": None,
        "user": None,
        "cost_usd": None,
        "waste_usd": None,
        **extra,
    }


def test_gpus_worst_first_by_waste_then_state() -> None:
    gpus = [
        gpu("GPU-busy", 0, "working", "compute_tensor", job="slurm:1", user="alice",
            cost_usd=4.0, waste_usd=0.3),
        gpu("GPU-held", 1, "idle-held", "idle_held", job="slurm:2", user="bob",
            cost_usd=4.03, waste_usd=4.03),
        gpu("GPU-lost", 2, "lost", None, lost=True, cost_usd=0.0, waste_usd=0.0),
        gpu("GPU-old", 3, "no-data", "idle_empty", cost_usd=0.0, waste_usd=0.0),
        gpu("GPU-copy", 4, "underused", "transfer_bound", cost_usd=0.0, waste_usd=0.0),
    ]  # fmt: skip
    rows = fleet_rows(gpus)
    assert [(r[1], r[3]) for r in rows] == [
        ("1", "idle-held"),
        ("0", "working"),
        ("2", "lost"),
        ("4", "underused"),
        ("3", "no-data"),
    ]
    assert rows[0][4:] == ["0%", "20/80 GiB", "slurm:2", "bob", "$4.03", "$4.03"]
    assert rows[1][4] == "90% compute-tensor"
    assert rows[3][4] == "0% transfer-bound"
    assert rows[4][4] == ""  # a stale GPU's last figures are not shown as current


def test_a_gpu_whose_memory_is_not_reported_says_so() -> None:
    blind = gpu("GPU-blind", 0, "idle-held", "idle_held", latest={}, memory_unknown=True)
    never = gpu("GPU-never", 1, "no-data", None, latest={})
    rows = {r[1]: r for r in fleet_rows([blind, never])}
    assert rows["0"][5] == "not reported"  # idle-held told by its job, not by memory seen
    assert rows["1"][5] == ""  # no sample: nothing was decided without it


def test_headline_names_the_filters_and_their_dollars() -> None:
    fleet = {"now": NOW.isoformat(), "start": "2026-12-03T00:00:00Z", "cost_usd": 9.0,
             "waste_usd": 8.1, "idle_usd": 8.1, "fixable_usd": 0.0, "lost_usd": 0.0,
             "gpus": [gpu("GPU-a", 0, "idle-held", "idle_held")] * 2}  # fmt: skip
    args = Namespace(node=None, team="vision", state="idle-held", cause=None)
    assert fleet_title(fleet, args) == (
        "2 GPUs (team vision, state idle-held) at 2026-12-03 08:00:00Z; since 2026-12-03 "
        "00:00Z: cost $9.00, waste $8.10 = idle $8.10 + fixable $0.00 (estimated)"
    )
    by_cost = fleet_rows(
        [gpu("GPU-a", 0, "working", "compute_tensor", cost_usd=4.0, waste_usd=0.1),
         gpu("GPU-b", 1, "idle", "idle_empty", cost_usd=2.0, waste_usd=2.0)],
        "cost",
    )  # fmt: skip
    assert [r[1] for r in by_cost] == ["0", "1"]


def test_job_report_shows_causes_efficiency_and_advice() -> None:
    summary = {
        "held_seconds": 7200.0,
        "allocated_seconds": 7000.0,
        "nodata_seconds": 200.0,
        "lost_seconds": 0.0,
        "cost_usd": 8.22,
        "waste_usd": 4.0,
        "idle_usd": 4.0,
        "fixable_usd": 0.0,
        "nodata_usd": 0.22,
        "lost_usd": 0.0,
        "efficiency": 0.375,
        "causes": {
            "idle_held": {"seconds": 3500.0, "usd": 4.0, "waste_usd": 4.0},
            "compute_tensor": {"seconds": 3500.0, "usd": 4.0, "waste_usd": 0.0},
            "launch_bound": {"seconds": 0.0, "usd": 0.0, "waste_usd": 0.0},
        },
        "top_cause": "idle_held",
    }
    job = {
        "id": "slurm:42",
        "user": "alice",
        "team": "vision",
        "project": None,
        "source": "api",
        "started_at": "2026-12-03T06:00:00Z",
        "ended_at": None,
        "gpus": [
            {
                "gpu_uuid": "GPU-a",
                "node": "node-a",
                "started_at": "2026-12-03T06:00:00Z",
                "ended_at": None,
            }
        ],
        "summary": summary,
        "per_gpu": [],
        "warnings": [],
    }
    text = job_report(job, now=NOW)
    assert "Job slurm:42 (user alice, team vision), registered by its scheduler or the API" in text
    assert "running 2026-12-03 06:00:00Z to now: 2h 00m" in text
    assert "GPU-a on node-a" in text
    assert "Efficiency (time-weighted activity): 38%" in text
    assert "Cost: $8.22 (no data $0.22)" in text
    assert "Waste: $4.00 = idle $4.00 + fixable $0.00 (estimated)" in text
    assert "Time and dollars by cause (cost, waste):" in text
    assert "idle_held" in text and "$4.00" in text and "50%" in text
    assert "launch_bound" not in text  # causes with no time are left out
    assert "idle_held: nothing running, memory held" in text
    assert "Tags" not in text and "wasted" not in text
