"""Real-GPU check of shared GPUs: three jobs' processes on one GPU, through the real agent and
the real central service.

Run on the device machine from the repository root (see docs/gpu-check/shared/README.md):

    SAMPLE_SECONDS=80 SPLIT_RULE=activity python3 docs/gpu-check/shared/tenants_check.py OUT_DIR

Three Slurm-like jobs are registered on GPU 0 as the prolog does, and three processes start at
once, each with its job's ``SLURM_JOB_ID``: bf16 matmuls back to back (busy), an input-starved
loop, and a notebook holding 22 GiB and running nothing. The agent (NVML + GPM every second,
per-process utilisation on a GPU with two or more processes) ships through a recording proxy
(``tenants_agent_output.jsonl``) to the central service (SQLite, ``GPUWARDEN_COST_SPLIT_RULE``
= ``SPLIT_RULE``). Then each job's ``GET /jobs/{id}``, the ``group_by=job`` and
``group_by=gpu`` cost reports are written to ``tenants_result.json`` and compared: each job's
dominant cause, and the jobs' dollars against the GPU's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from advice_check import TMP, Central, iso  # noqa: E402

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-check-out")
SECONDS = float(os.environ.get("SAMPLE_SECONDS", "80"))
RULE = os.environ.get("SPLIT_RULE", "activity")
TENANTS = {"slurm:9101": "compute_tensor", "slurm:9102": "input_starved", "slurm:9103": "idle_held"}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    central = Central(OUT / "tenants_agent_output.jsonl", {"GPUWARDEN_COST_SPLIT_RULE": RULE})
    try:
        gpus = central.gpu_uuids()[:1]
        time.sleep(3)
        for job_id, phase in TENANTS.items():
            central.start_job(job_id, gpus, user="alice", team=f"team-{phase}")
        t0 = time.time()
        procs = [
            subprocess.Popen(
                [sys.executable, str(HERE.parent / "causes_workload.py"), str(SECONDS),
                 str(TMP / f"tenant-{phase}.json"), phase],
                env=dict(central.env, SLURM_JOB_ID=job_id.removeprefix("slurm:"),
                         SLURM_JOB_USER="alice"),
            )
            for job_id, phase in TENANTS.items()
        ]  # fmt: skip
        for p in procs:
            p.wait()
        t1 = time.time()
        for job_id in TENANTS:
            central.end_job(job_id)
        time.sleep(3)
        central.stop_agent()
        time.sleep(6)  # a second rollup round: shared minutes are split after the jobs end
        start, end = t0 - 10, t1 + 10
        jobs = {
            j: central.http.get(f"/api/v1/jobs/{j}", headers=central.headers()).json()
            for j in TENANTS
        }
        reports = {
            by: central.http.get(
                "/api/v1/reports/cost",
                params={"start": iso(start), "end": iso(end), "group_by": by},
                headers=central.headers(),
            ).json()
            for by in ("job", "gpu")
        }
        text = central.report_text(start, end, "--group-by", "job")
    finally:
        central.close()
    result = {
        "seconds": SECONDS,
        "split_rule": RULE,
        "window": [t0, t1],
        "tenants": TENANTS,
        "nvidia_smi": subprocess.run(
            "nvidia-smi || true", shell=True, capture_output=True, text=True
        ).stdout,
        "jobs": jobs,
        "reports": reports,
    }
    (OUT / "tenants_result.json").write_text(json.dumps(result, indent=1, default=str))
    (OUT / "tenants_report.txt").write_text(text)
    rows = {r["key"]: r for r in reports["job"]["rows"]}
    for job_id, phase in TENANTS.items():
        row = rows.get(job_id, {})
        causes = {k: round(v["seconds"], 1) for k, v in (row.get("causes") or {}).items()}
        print(
            f"{job_id} ({phase}): ${row.get('cost_usd')} {row.get('allocated_seconds')} s {causes}"
        )
    gpu_usd = sum(r["cost_usd"] or 0 for r in reports["gpu"]["rows"])
    jobs_usd = sum(r["cost_usd"] or 0 for r in reports["job"]["rows"])
    print(f"GPU ${gpu_usd:.4f}; jobs + unallocated ${jobs_usd:.4f}")
    print(text)


if __name__ == "__main__":
    main()
