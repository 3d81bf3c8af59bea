"""Real-GPU check of the recommendations: one Slurm-like job per workload, each its own process.

Run on the device machine from the repository root (see docs/gpu-check/README.md):

    PHASE_SECONDS=36 python3 docs/gpu-check/advice_check.py OUT_DIR

The real agent (NVML + GPM, every second) ships through a recording proxy to the real central
service (SQLite). For each workload of ``causes_workload.py`` (and ``idle_empty``: a job that
holds the GPU and runs nothing) a job is registered as the Slurm prolog does (``POST /jobs``
with the agent's token and the GPU), the workload runs as its own process with
``SLURM_JOB_ID`` set (so the agent attributes it to the same job), and the job is ended as the
epilog does. Then each job's ``GET /jobs/{id}`` (summary, causes, recommendations, energy), the
``group_by=job`` cost report and ``gpuwarden report cost`` are recorded
(``advice_result.json``, ``advice_report.txt``) and the verdicts printed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from causes_check import cli, free_port, nvidia_smi_cards, start_agent, wait_healthy  # noqa: E402

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-check-out")
PHASE_SECONDS = float(os.environ.get("PHASE_SECONDS", "36"))
BACKEND = os.environ.get("BACKEND", "nvml")  # "simulated" for a dry run without a GPU
PHASES = os.environ.get(
    "PHASES",
    "idle_empty,idle_held,launch_bound,input_starved,transfer_bound,memory_bound,"
    "compute_no_tensor,compute_tensor,mig_fit",
).split(",")
TMP = Path(os.environ.get("TMP_DIR", "/tmp/gwc-advice"))
NODE = "h200-check"
FIRST_JOB = 9001


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


class Central:
    """The central service (SQLite), the recording proxy and the agent, as processes."""

    def __init__(self, record: Path, extra_env: dict[str, str] | None = None) -> None:
        TMP.mkdir(parents=True, exist_ok=True)
        db = TMP / "gw.db"
        db.unlink(missing_ok=True)
        port = free_port()
        self.env = dict(
            os.environ,
            PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            GPUWARDEN_DATABASE_URL=f"sqlite:///{db}",
            GPUWARDEN_PORT=str(port),
            GPUWARDEN_ROLLUP_INTERVAL_SECONDS="5",
            **(extra_env or {}),
        )
        cli("migrate", env=self.env)
        self.agent_token = cli("token", "create", "--role", "agent", "--node", NODE, env=self.env)
        self.reader = cli("token", "create", "--role", "reader", env=self.env)
        self.url = f"http://127.0.0.1:{port}"
        self.central = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve"], env=self.env
        )
        wait_healthy(self.url)
        self.proxy, self.agent = start_agent(
            self.url, record, token=self.agent_token, node=NODE, backend=BACKEND,
            batch_seconds=2, tmp=TMP, env=self.env,
        )  # fmt: skip
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def headers(self, role: str = "reader") -> dict[str, str]:
        token = self.agent_token if role == "agent" else self.reader
        return {"Authorization": f"Bearer {token}"}

    def gpu_uuids(self) -> list[str]:
        """The GPUs the agent has reported, waiting for its first batch."""
        for _ in range(60):
            gpus = self.http.get("/api/v1/gpus", headers=self.headers()).json()
            if gpus:
                return [g["uuid"] for g in gpus]
            time.sleep(0.5)
        raise SystemExit("the agent shipped nothing in 30 s")

    def start_job(self, job_id: str, gpus: list[str], *, user: str, team: str) -> None:
        """Register a job as the Slurm prolog does."""
        body = {
            "id": job_id,
            "user": user,
            "team": team,
            "gpus": gpus,
            "started_at": iso(time.time()),
        }
        r = self.http.post("/api/v1/jobs", json=body, headers=self.headers("agent"))
        if r.status_code != 201:
            raise SystemExit(f"POST /jobs {job_id}: {r.status_code} {r.text}")

    def end_job(self, job_id: str) -> None:
        """End a job as the Slurm epilog does."""
        r = self.http.patch(
            f"/api/v1/jobs/{job_id}", json={"ended_at": iso(time.time())},
            headers=self.headers("agent"),
        )  # fmt: skip
        if r.status_code != 200:
            raise SystemExit(f"PATCH /jobs/{job_id}: {r.status_code} {r.text}")

    def stop_agent(self) -> None:
        self.agent.send_signal(signal.SIGTERM)  # ships what it holds, then exits
        self.agent.wait(30)
        time.sleep(7)  # a rollup round

    def report_text(self, start: float, end: float, *args: str) -> str:
        env = dict(self.env, GPUWARDEN_CENTRAL_URL=self.url, GPUWARDEN_API_TOKEN=self.reader)
        r = subprocess.run(
            [sys.executable, "-m", "service.cli", "report", "cost", "--start", iso(start),
             "--end", iso(end), *args],
            env=env, capture_output=True, text=True,
        )  # fmt: skip
        return r.stdout + r.stderr

    def close(self) -> None:
        self.central.send_signal(signal.SIGTERM)
        self.central.wait(30)
        self.proxy.shutdown()


def run_phase(phase: str, job_id: str, env: dict[str, str]) -> dict[str, Any]:
    """One workload as its own process, in the job's Slurm environment (no process for
    idle_empty: the job holds the GPU and runs nothing)."""
    t0 = time.time()
    if phase == "idle_empty":
        time.sleep(PHASE_SECONDS)
    else:
        phases_file = TMP / f"{phase}.json"
        subprocess.run(
            [sys.executable, str(HERE / "causes_workload.py"), str(PHASE_SECONDS),
             str(phases_file), phase],
            env=dict(env, SLURM_JOB_ID=job_id.removeprefix("slurm:"), SLURM_JOB_USER="alice"),
            check=True,
        )  # fmt: skip
    return {"phase": phase, "job": job_id, "start": t0, "end": time.time()}


def verdict(phase: str, job: dict[str, Any]) -> str:
    """One line: the job's dominant cause, cost, top fix and any MIG offer."""
    s = job["summary"]
    fixes = job.get("recommendations") or []
    top = fixes[0] if fixes else None
    mig = [f for f in fixes if f["kind"] == "mig"]
    top_txt = (
        f"top fix {top['kind']}:{top.get('cause') or top.get('profile')} "
        f"saves ${top['saving_usd']:.4f} ({top['saving_fraction']:.0%} of ${top['usd']:.4f})"
        if top
        else "no fix"
    )
    mig_txt = f"; MIG {mig[0]['profile']} saves ${mig[0]['saving_usd']:.4f}" if mig else ""
    return (
        f"{phase:<18} {s['allocated_seconds']:6.1f} s ${s['cost_usd']:.4f} "
        f"dominant {s.get('dominant_waste_cause')}; {top_txt}{mig_txt}; "
        f"{s['energy_kwh'] * 1000:.2f} Wh"
    )


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    central = Central(OUT / "advice_agent_output.jsonl")
    try:
        gpus = central.gpu_uuids()[:1]
        time.sleep(3)  # GPM primed
        phases = []
        for i, phase in enumerate(PHASES):
            job_id = f"slurm:{FIRST_JOB + i}"
            central.start_job(job_id, gpus, user="alice", team=f"team-{phase}")
            phases.append(run_phase(phase, job_id, central.env))
            central.end_job(job_id)
            print(f"{phase} done", flush=True)
        time.sleep(3)
        central.stop_agent()
        start, end = phases[0]["start"] - 5, phases[-1]["end"] + 5
        jobs = {
            ph["phase"]: central.http.get(
                f"/api/v1/jobs/{ph['job']}", headers=central.headers()
            ).json()
            for ph in phases
        }
        report = central.http.get(
            "/api/v1/reports/cost",
            params={"start": iso(start), "end": iso(end), "group_by": "job"},
            headers=central.headers(),
        ).json()
        text = central.report_text(start, end, "--group-by", "job")
    finally:
        central.close()
    (OUT / "advice_report.txt").write_text(text)
    result = {
        "phase_seconds": PHASE_SECONDS,
        "nvidia_smi_L": nvidia_smi_cards(),
        "phases": phases,
        "jobs": jobs,
        "report": report,
    }
    (OUT / "advice_result.json").write_text(json.dumps(result, indent=1, default=str))
    for phase, job in jobs.items():
        print(verdict(phase, job))
    print(text)


if __name__ == "__main__":
    main()
