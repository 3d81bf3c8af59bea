"""The terminal views: `gpuwarden gpus` rows worst first, and `gpuwarden job`'s plain report."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from service.cli.fleet import fleet_rows, gpu_state, job_report

NOW = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)
GIB = 1024**3


def gpu(uuid: str, index: int, cause: str | None, **extra: object) -> dict[str, object]:
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
        "job": None,
        "user": None,
        **extra,
    }


def test_gpus_worst_first_with_state_and_filter() -> None:
    gpus = [
        gpu("GPU-busy", 0, "compute_tensor", job="slurm:1", user="alice"),
        gpu("GPU-held", 1, "idle_held", job="slurm:2", user="bob"),
        gpu("GPU-lost", 2, None, lost=True),
        gpu("GPU-old", 3, "idle_empty", last_seen_at=(NOW - timedelta(hours=1)).isoformat()),
    ]
    wasted = {"GPU-busy": 0.3, "GPU-held": 4.03, "GPU-lost": 0.0}
    rows = fleet_rows(gpus, wasted, now=NOW)
    assert [(r[1], r[3]) for r in rows] == [
        ("1", "idle-held"),
        ("0", "busy"),
        ("2", "lost"),
        ("3", "no-data"),
    ]
    assert rows[0][4:] == ["0%", "20/80 GiB", "slurm:2", "bob", "$4.03"]
    assert rows[1][4] == "90% compute-tensor"
    assert [r[1] for r in fleet_rows(gpus, wasted, now=NOW, state="idle-held")] == ["1"]
    assert gpu_state(gpus[3], NOW) == "no-data"


def test_job_report_shows_causes_efficiency_and_advice() -> None:
    summary = {
        "held_seconds": 7200.0,
        "allocated_seconds": 7000.0,
        "cost_usd": 8.0,
        "idle_cost_usd": 4.0,
        "unused_cost_usd": 5.0,
        "efficiency": 0.375,
        "causes": {
            "idle_held": {"seconds": 3500.0, "usd": 4.0},
            "compute_tensor": {"seconds": 3500.0, "usd": 4.0},
            "launch_bound": {"seconds": 0.0, "usd": 0.0},
        },
        "dominant_waste_cause": "idle_held",
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
        "dominant_waste_cause": "idle_held",
        "tags": [{"tag": "idle-held", "hint": "end the notebook"}],
        "warnings": [],
    }
    text = job_report(job, now=NOW)
    assert "Job slurm:42 (user alice, team vision), from api" in text
    assert "running 2026-12-03 06:00:00Z to now: 2h 00m" in text
    assert "GPU-a on node-a" in text
    assert "Efficiency (time-weighted activity): 38%" in text
    assert "Time and dollars by cause:" in text
    assert "idle_held" in text and "$4.00" in text and "50%" in text
    assert "launch_bound" not in text  # causes with no time are left out
    assert "most waste is idle_held: nothing running, memory held" in text
    assert "idle-held: end the notebook" in text
