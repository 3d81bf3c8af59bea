"""Real-GPU calibration of the recoverable shares: each wasteful run, then the same work fixed.

Run on the device machine from the repository root (see docs/gpu-check/calibration/README.md):

    RUN_SECONDS=22 python3 docs/gpu-check/calibration/calib_check.py OUT_DIR
    BACKEND=simulated RUNS=memory_bound:before RUN_SECONDS=6 \
        python3 docs/gpu-check/calibration/calib_check.py /tmp/out   # no GPU: a dry run

The real agent (NVML + GPM, every second) ships through a recording proxy to the real central
service (SQLite), as ``advice_check.py`` does. Each run of ``calib_workload.py`` is its own job
(registered and ended as the Slurm prolog and epilog do) and its own process; the run measures
its seconds per unit of work. Recorded: every batch the agent shipped (``calib_agent_output.jsonl``),
each run's timing and its job's ``GET /jobs/{id}`` with the causes the central stored
(``calib_runs.json``). ``calib_predict.py`` then computes the predicted savings from the stored
samples and puts them beside the real ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GPU_CHECK = HERE.parent
sys.path.insert(0, str(GPU_CHECK))
sys.path.insert(0, str(GPU_CHECK.parents[1]))

import advice_check  # noqa: E402
from advice_check import Central  # noqa: E402
from causes_check import nvidia_smi_cards  # noqa: E402

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "calib-out")
RUN_SECONDS = float(os.environ.get("RUN_SECONDS", "22"))
TARGET_SECONDS = float(os.environ.get("TARGET_SECONDS", "12"))
BACKEND = os.environ.get("BACKEND", "nvml")
CAUSES = ("input_starved", "compute_no_tensor", "launch_bound", "transfer_bound", "memory_bound")
RUNS = os.environ.get(
    "RUNS",
    ",".join(
        ["fed:target", "launch:target", "launch_eager:target", "transfer:target",
         "memory:target"]
        + [f"{c}:{k}" for c in CAUSES for k in ("before", "after")]
    ),
).split(",")
FIRST_JOB = 9101


def run_one(run: str, job_id: str, env: dict[str, str]) -> dict[str, Any]:
    """One run as its own process in its job's Slurm environment; its timing."""
    seconds = TARGET_SECONDS if run.endswith(":target") else RUN_SECONDS
    out = advice_check.TMP / f"run-{job_id.removeprefix('slurm:')}.json"
    if BACKEND == "simulated":  # no GPU: the job holds the (simulated) GPU and sleeps
        t0 = time.time()
        time.sleep(seconds)
        timing: dict[str, Any] = {"run": run, "start": t0, "end": time.time(), "steps": 0}
    else:
        t0 = time.time()
        r = subprocess.run(
            [sys.executable, str(HERE / "calib_workload.py"), run, str(seconds), str(out)],
            env=dict(env, SLURM_JOB_ID=job_id.removeprefix("slurm:"), SLURM_JOB_USER="alice"),
            capture_output=True, text=True,
        )  # fmt: skip
        if r.returncode != 0 or not out.exists():  # recorded, and the other runs go on
            print(r.stdout + r.stderr, flush=True)
            timing = {"run": run, "start": t0, "end": time.time(), "error": r.stderr[-2000:]}
        else:
            timing = json.loads(out.read_text())
    return dict(timing, job=job_id)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    advice_check.TMP = Path(os.environ.get("TMP_DIR", "/tmp/gwc-calib"))
    advice_check.BACKEND = BACKEND
    central = Central(OUT / "calib_agent_output.jsonl")
    runs: list[dict[str, Any]] = []
    try:
        gpus = central.gpu_uuids()[:1]
        time.sleep(3)  # GPM primed
        for i, run in enumerate(RUNS):
            job_id = f"slurm:{FIRST_JOB + i}"
            central.start_job(job_id, gpus, user="alice", team=f"team-{run.split(':')[0]}")
            t0 = time.time()
            timing = run_one(run, job_id, central.env)
            central.end_job(job_id)
            runs.append(dict(timing, job_start=t0, job_end=time.time()))
            print(f"{run} done: {timing.get('seconds_per_step')} s/step", flush=True)
        time.sleep(3)
        central.stop_agent()
        jobs = {
            r["job"]: central.http.get(f"/api/v1/jobs/{r['job']}", headers=central.headers()).json()
            for r in runs
        }
    finally:
        central.close()
    result = {
        "run_seconds": RUN_SECONDS,
        "target_seconds": TARGET_SECONDS,
        "backend": BACKEND,
        "nvidia_smi_L": nvidia_smi_cards(),
        "nvidia_smi_pcie": subprocess.run(
            "nvidia-smi --query-gpu=name,pcie.link.gen.max,pcie.link.width.max,driver_version "
            "--format=csv || true",
            shell=True, capture_output=True, text=True,
        ).stdout.strip(),  # fmt: skip
        "runs": runs,
        "jobs": jobs,
    }
    (OUT / "calib_runs.json").write_text(json.dumps(result, indent=1, default=str))
    for r in runs:
        s = jobs[r["job"]]["summary"]
        causes = {k: round(v["seconds"], 1) for k, v in (s.get("causes") or {}).items() if v["seconds"]}
        print(f"{r['run']:<26} {r.get('seconds_per_step')} s/step  {causes}")


if __name__ == "__main__":
    main()
