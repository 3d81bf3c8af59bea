"""The predicted savings of the calibration runs beside the real ones (no GPU needed).

Run from the repository root after ``calib_check.py``:

    python3 docs/gpu-check/calibration/calib_predict.py docs/gpu-check/calibration

Reads ``calib_runs.json`` and ``calib_agent_output.jsonl`` (every batch the agent shipped),
decides each recorded sample as the central does, and writes ``calib_result.json``:

- ``targets``: what the ``:target`` runs measured (the figures ``recoverable.TARGETS`` holds);
- per pair, the share predicted from the wasteful run's samples (its job's integrals, through
  ``recommend.fix_fraction`` as the central computes it), the real saving
  ``1 - t_after / t_before`` from the two runs' seconds per step, and what the fixed run is
  told over its timed seconds (after the warm-up): the fix it already applied must not be
  promised.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from service.costs.integrals import ActivityPoint, Integrals, Thresholds, integrate, point_of
from service.costs.recommend import FIX_ACTIONS, FixAssumptions, cause_fix
from service.costs.recoverable import pcie_bytes_per_second, peaks_of
from service.core.diagnosis import Cause

TOLERANCE = 0.10  # predicted within 10 percentage points of the real saving
# The words naming each pair's fix: the fixed run, which applies it, must not be told it.
APPLIED = {
    "input_starved": "DataLoader workers",
    "compute_no_tensor": "autocast",
    "launch_bound": "CUDA graphs",
    "transfer_bound": "pinned",
    "memory_bound": "bf16",
}


def _unix(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def load_points(record: Path) -> tuple[list[ActivityPoint], str]:
    """The recorded samples decided under the default thresholds, and the GPU's model."""
    th = Thresholds()
    points, model = [], ""
    for line in record.read_text().splitlines():
        batch = json.loads(line)
        model = batch["gpus"][0]["model"]
        listed = bool(batch.get("processes"))
        for s in batch["samples"]:
            ts = datetime.fromisoformat(s["ts"].replace("Z", "+00:00")).timestamp()
            points.append(point_of(ts, s["metrics"], th, has_process=listed))
    return sorted(points, key=lambda p: p.ts), model


def _mean(points: list[ActivityPoint], lo: float, hi: float, cause: Cause, attr: str) -> float:
    vals = [
        float(getattr(p, attr))
        for p in points
        if lo <= p.ts <= hi and p.cause == int(cause) and getattr(p, attr) is not None
    ]
    return sum(vals) / len(vals) if vals else float("nan")


def targets(runs: dict[str, dict[str, Any]], points: list[ActivityPoint], model: str) -> dict[str, float]:  # fmt: skip
    """What the target runs reached, over their timed seconds."""

    def window(run: str) -> tuple[float, float]:
        r = runs[run]
        return r["start"] + r["warm_seconds"], r["end"]

    fed = _mean(points, *window("fed:target"), Cause.COMPUTE_TENSOR, "duty")
    graph = _mean(points, *window("launch:target"), Cause.LAUNCH_BOUND, "duty")
    out = {"fed_duty": fed, "graph_duty": graph}
    if "launch_eager:target" in runs:
        eager = _mean(points, *window("launch_eager:target"), Cause.LAUNCH_BOUND, "duty")
        t_graph = runs["launch:target"]["seconds_per_step"]
        t_eager = runs["launch_eager:target"]["seconds_per_step"]
        out |= {
            "eager_duty": eager,
            "graph_seconds_per_kernel": t_graph / 1000,
            "eager_seconds_per_kernel": t_eager / 1000,
            "graph_engine_ratio": (graph * t_graph) / (eager * t_eager),
        }
    pcie = _mean(points, *window("transfer:target"), Cause.TRANSFER_BOUND, "pcie")
    peaks = peaks_of(model)
    if peaks is not None:
        raw = pcie_bytes_per_second(peaks.pcie_gen, peaks.pcie_lanes)
        out |= {"pcie_bytes_per_second": pcie, "pcie_practical_share": pcie / raw}
    out["dram_practical"] = _mean(points, *window("memory:target"), Cause.MEMORY_BOUND, "dram")
    return out


def _told(integ: Integrals, cause: Cause, a: FixAssumptions) -> dict[str, Any]:
    seconds = getattr(integ, f"{cause.label}_seconds")
    if seconds <= 0:
        return {"cause_seconds": 0.0, "covered_seconds": integ.covered_seconds}
    share, why, instead = cause_fix(cause, a, integ)
    return {
        "cause_seconds": seconds,
        "covered_seconds": integ.covered_seconds,
        "share": share,
        "action": instead or FIX_ACTIONS[cause],
        "assumption": why,
    }


def _promised_share(told: dict[str, Any]) -> float:
    """The share of the covered seconds a fix promises to save."""
    cov = told["covered_seconds"]
    return float(told.get("share", 0.0) * told["cause_seconds"] / cov) if cov else 0.0


def _promised(told: dict[str, Any]) -> bool:
    """A fix promises more than TOLERANCE of the covered seconds."""
    return _promised_share(told) > TOLERANCE


def live_share(job: dict[str, Any], cause: str) -> float | None:
    """The share the live central gave the cause's fix in the recorded GET /jobs/{id}."""
    for f in job.get("recommendations") or []:
        if f.get("cause") == cause:
            return float(f["saving_fraction"])
    return None


def pair(runs: dict[str, dict[str, Any]], points: list[ActivityPoint], name: str, a: FixAssumptions) -> dict[str, Any]:  # fmt: skip
    """One pair's predicted and real saving and what its fixed run is told."""
    th = Thresholds()
    cause = Cause[name.upper()]
    before, after = runs[f"{name}:before"], runs[f"{name}:after"]
    job = integrate(points, *before["interval"], th)
    share, why, instead = cause_fix(cause, a, job)
    real = 1.0 - after["seconds_per_step"] / before["seconds_per_step"]
    fixed_job = integrate(points, *after["interval"], th)
    # The seconds the steps were timed over, less the first sample's (it describes the second
    # before it, when the first timed step may not have started).
    timed_from = after.get("timed_from", after["end"] - after["timed_seconds"])
    fixed_timed = integrate(points, timed_from + 1.0, after["end"], th)
    told = _told(fixed_timed, cause, a)
    told_job = _told(fixed_job, cause, a)
    promised = bool(_promised(told) and APPLIED[name] in str(told.get("action", "")))
    return {
        "cause": name,
        "before_seconds_per_step": before["seconds_per_step"],
        "after_seconds_per_step": after["seconds_per_step"],
        "real_saving": real,
        "predicted_share": share,
        "predicted_assumption": why,
        "predicted_action": instead or FIX_ACTIONS[cause],
        "cause_seconds_before": getattr(job, f"{name}_seconds"),
        "difference_points": 100.0 * (share - real),
        "within_tolerance": abs(share - real) <= TOLERANCE,
        "fixed_run_timed": told,
        "fixed_run_job": told_job,
        "fixed_job_promised_saving": _promised_share(told_job),
        "fixed_run_promised_applied_fix": promised,
    }


def main() -> None:
    here = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent)
    recorded = json.loads((here / "calib_runs.json").read_text())
    runs = {r["run"]: r for r in recorded["runs"]}
    for r in runs.values():  # the job's interval as the central stored it
        (iv,) = recorded["jobs"][r["job"]]["gpus"]
        r["interval"] = tuple(_unix(iv[k]) for k in ("started_at", "ended_at"))
    points, model = load_points(here / "calib_agent_output.jsonl")
    a = FixAssumptions(gpu_model=model)
    names = [n for n in APPLIED if f"{n}:before" in runs and f"{n}:after" in runs]
    result = {
        "gpu_model": model,
        "tolerance": TOLERANCE,
        "targets": targets(runs, points, model),
        "pairs": [
            dict(pair(runs, points, n, a), live_central_share=live_share(
                recorded["jobs"][runs[f"{n}:before"]["job"]], n))
            for n in names
        ],  # fmt: skip
    }
    (here / "calib_result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result["targets"], indent=1))
    for p in result["pairs"]:
        t = p["fixed_run_timed"]
        print(
            f"{p['cause']:<18} {p['before_seconds_per_step'] * 1e3:8.3f} -> "
            f"{p['after_seconds_per_step'] * 1e3:7.3f} ms/step real {p['real_saving']:.1%} "
            f"predicted {p['predicted_share']:.1%} ({p['difference_points']:+.1f} pp); fixed run "
            f"told {t.get('share', 0.0):.0%}: {str(t.get('action', '-'))[:60]}"
        )


if __name__ == "__main__":
    main()
