"""Real-GPU check of realised savings (issue 46): each job run wasteful, then the same job key
run again with the fix GPU Warden named, under the real agent and central.

Run on the device machine from the repository root (see docs/gpu-check/savings/README.md):

    RUN_SECONDS=16 UPSTREAM_SECONDS=30 python3 docs/gpu-check/savings/savings_check.py OUT_DIR
    BACKEND=simulated RUN_SECONDS=5 UPSTREAM_SECONDS=6 FIXED_STEPS=20 \
        python3 docs/gpu-check/savings/savings_check.py /tmp/out     # no GPU: a dry run

The real agent (NVML + GPM, every second) ships through a recording proxy to the real central
service (SQLite), as ``../advice_check.py`` does. Each run is its own Slurm-like job (registered
with the agent's token as the prolog does, with the job name, account, partition and the
training script's sha256 as labels, the same for both runs of a pair; ended by PATCH as the
epilog does) and its own process with ``SLURM_JOB_ID`` set. The pairs:

- the five calibration workloads (``savings_workload.py`` over
  ``../calibration/calib_workload.py``), each run for RUN_SECONDS reporting its steps with
  ``service.progress.ProgressReporter``;
- one fixed-size pair (FIXED_STEPS steps of ``compute_no_tensor``, no progress: the unit is the
  run);
- two public training scripts, unpatched (``upstream/``): pytorch/examples ``imagenet/main.py
  --dummy`` at ``-j 0`` then ``-j 12``, and pytorch-image-models ``train.py`` (a ViT-L/16 on a
  synthetic ImageFolder made here) in fp32 then ``--amp --amp-dtype bfloat16``; each runs
  UPSTREAM_SECONDS, its printed step counter is read and sent as progress by this script.

Recorded in OUT_DIR: ``savings_agent_output.jsonl`` (every batch the agent shipped),
``savings_progress_posts.jsonl`` (every progress POST, with the central's answer),
``savings_runs.json`` (registrations, ends, each run's own timing, each job's
``GET /jobs/{id}`` and ``GET /jobs/{id}/progress``), the upstream scripts' logs.
``savings_compare.py`` puts the realised savings beside the measured and promised ones.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
GPU_CHECK = HERE.parent
ROOT = GPU_CHECK.parents[1]
sys.path.insert(0, str(GPU_CHECK))
sys.path.insert(0, str(ROOT))

import advice_check  # noqa: E402
from causes_check import free_port  # noqa: E402

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "savings-out")
BACKEND = os.environ.get("BACKEND", "nvml")
RUN_SECONDS = float(os.environ.get("RUN_SECONDS", "16"))
UPSTREAM_SECONDS = float(os.environ.get("UPSTREAM_SECONDS", "30"))
FIXED_STEPS = int(os.environ.get("FIXED_STEPS", "250"))
WARM = float(os.environ.get("WARM_SECONDS", "3"))
TIMM_SRC = os.environ.get("TIMM_SRC", str(ROOT / ".gpu" / "timm-src"))
SYNTH = Path(os.environ.get("SYNTH_DIR", "/tmp/gwc-synth-imagefolder"))
CAUSES = ("input_starved", "compute_no_tensor", "launch_bound", "transfer_bound", "memory_bound")
IMAGENET = HERE / "upstream" / "pytorch-examples" / "imagenet" / "main.py"
TIMM = HERE / "upstream" / "pytorch-image-models" / "train.py"
WORKLOAD = HERE / "savings_workload.py"
FIRST_JOB = 9201


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- the pairs -------------------------------------------------------------------------------


def pairs() -> list[dict[str, Any]]:
    """Every pair: its name, the cause its wasteful run shows, how it runs and its job key."""
    out: list[dict[str, Any]] = [
        {"pair": c, "cause": c, "kind": "progress", "script": WORKLOAD} for c in CAUSES
    ]
    out.append(
        {"pair": "compute_no_tensor_fixed", "cause": "compute_no_tensor", "kind": "fixed",
         "script": WORKLOAD}
    )  # fmt: skip
    common = ["--dummy", "-a", "resnet50", "-b", "256", "--gpu", "0", "-p", "5"]
    out.append(
        {"pair": "imagenet_resnet50", "cause": "input_starved", "kind": "upstream",
         "script": IMAGENET, "parse": "imagenet",
         "before": [*common, "-j", "0"], "after": [*common, "-j", "12"]}
    )  # fmt: skip
    timm = [
        "--data-dir", str(SYNTH), "--val-split", "", "--model", "vit_large_patch16_224",
        "--num-classes", "10", "-b", "64", "-j", "12", "--pin-mem", "--epochs", "1",
        "--epoch-repeats", "200", "--warmup-epochs", "0", "--log-interval", "5",
        "--synchronize-step",
        "--output", "/tmp/gwc-timm-out",
    ]  # fmt: skip
    out.append(
        {"pair": "timm_vit_l16", "cause": "compute_no_tensor", "kind": "upstream",
         "script": TIMM, "parse": "timm",
         # TF32 off at the driver for both runs (train.py turns it on): see the README
         "env": {"NVIDIA_TF32_OVERRIDE": "0", "PYTHONPATH": TIMM_SRC},
         "before": timm, "after": [*timm, "--amp", "--amp-dtype", "bfloat16"]}
    )  # fmt: skip
    only = os.environ.get("PAIRS")
    return [p for p in out if not only or p["pair"] in only.split(",")]


# --- the upstream scripts' printed step counters -------------------------------------------

# pytorch/examples imagenet: "Epoch: [0][ 11/5005]\tTime  0.552 ( 0.601)\t..." (steps done, the
# step's seconds and their running mean since the epoch began).
IMAGENET_LINE = re.compile(r"Epoch: \[\d+\]\[\s*(\d+)/\s*\d+\]\s+Time\s+([\d.]+)\s+\(\s*([\d.]+)\)")
# timm: "Train: 0 [  10/3125 (  0%)]  Loss: ... Time: 0.150s, 853.33/s  (0.160s, 800.00/s)" (the
# update's index from 0, its seconds and their running mean).
TIMM_LINE = re.compile(r"Train: \d+ \[\s*(\d+)/\s*\d+ .*?Time: ([\d.]+)s, .*?\(([\d.]+)s,")


def parse_line(kind: str, line: str) -> tuple[int, float] | None:
    """(steps done, mean seconds per step since the epoch began) from one printed line."""
    if kind == "imagenet":
        m = IMAGENET_LINE.search(line)
        return (int(m.group(1)), float(m.group(3))) if m else None
    m = TIMM_LINE.search(line)
    return (int(m.group(1)) + 1, float(m.group(3))) if m else None


def own_seconds_per_step(points: list[dict[str, float]]) -> dict[str, Any]:
    """Seconds per step from the script's own printed running means, between the first line
    printed WARM seconds after its first and its last: (n2 * mean2 - n1 * mean1) / (n2 - n1)."""
    if len(points) < 2:
        return {"seconds_per_step": None}
    t0 = points[0]["t"]
    first = next((p for p in points if p["t"] >= t0 + WARM), points[0])
    last = points[-1]
    if last["steps"] <= first["steps"]:
        return {"seconds_per_step": None}
    n = last["steps"] - first["steps"]
    own = (last["steps"] * last["mean"] - first["steps"] * first["mean"]) / n
    return {
        "seconds_per_step": own,
        "seconds_per_step_by_arrival": (last["t"] - first["t"]) / n,
        "timed_from_step": first["steps"],
        "timed_to_step": last["steps"],
    }


def fake_upstream(kind: str, phase: str) -> None:
    """The upstream scripts' printing without a GPU (BACKEND=simulated): a line a step."""
    step = 0.12 if phase == "before" else 0.03
    time.sleep(1.0)
    for i in range(1 << 30):
        time.sleep(step)
        if i % 5 == 0:
            if kind == "imagenet":
                print(f"Epoch: [0][{i + 1:4d}/5005]\tTime  {step:.3f} ({step:6.3f})", flush=True)
            else:
                print(f"Train: 0 [{i:4d}/3125 (  0%)]  Loss: 6.9 (6.9)  Time: {step:.3f}s, "
                      f"1.0/s  ({step:.3f}s, 1.0/s)  LR: 1e-3", flush=True)  # fmt: skip


def synthetic_imagefolder() -> None:
    """An ImageFolder of JPEGs (10 classes x 4,800, 64 x 64 noise): timm's train.py input.

    100 distinct images per class, each hard-linked 48 times: an epoch of 750 steps at batch 64
    outlasts UPSTREAM_SECONDS even in bf16 (``--epoch-repeats`` only repeats iterable datasets,
    so the folder itself must be big enough), and making it takes a second.
    """
    if BACKEND == "simulated" or (SYNTH / "train").exists():
        return
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(10):
        d = SYNTH / "train" / f"class{c}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(100):
            px = rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)
            Image.fromarray(px).save(d / f"{i}.jpg", quality=90)
            for copy in range(1, 48):
                os.link(d / f"{i}.jpg", d / f"{i}_{copy}.jpg")


# --- recording -------------------------------------------------------------------------------


def recording_proxy(central: str, record: Path) -> tuple[ThreadingHTTPServer, int]:
    """Passes every POST to the central service unchanged; ingest batches (decompressed) go to
    ``record``, other POSTs (progress) to savings_progress_posts.jsonl with the answer."""
    import gzip

    client = httpx.Client(timeout=30)
    lock = threading.Lock()
    posts = record.parent / "savings_progress_posts.jsonl"
    posts.unlink(missing_ok=True)
    arrivals = record.parent / "savings_batch_arrivals.jsonl"
    arrivals.unlink(missing_ok=True)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            try:
                r = client.post(central + self.path, content=body, headers=headers)
            except httpx.TransportError:  # a kept-alive connection the central closed: again
                r = client.post(central + self.path, content=body, headers=headers)
            with lock:
                if self.path.endswith("/ingest"):
                    gz = self.headers.get("Content-Encoding") == "gzip"
                    with record.open("ab") as fh:
                        fh.write((gzip.decompress(body) if gz else body).strip() + b"\n")
                    with arrivals.open("a") as fh:  # when it reached the central, by line
                        fh.write(json.dumps({"received": time.time(), "status": r.status_code}))
                        fh.write("\n")
                else:
                    entry = {"path": self.path, "received": time.time(), "status": r.status_code,
                             "body": json.loads(body or b"null")}  # fmt: skip
                    with posts.open("a") as fh:
                        fh.write(json.dumps(entry) + "\n")
            self.send_response(r.status_code)
            self.send_header("Content-Type", r.headers.get("content-type", "application/json"))
            self.send_header("Content-Length", str(len(r.content)))
            self.end_headers()
            self.wfile.write(r.content)

        def log_message(self, *args: Any) -> None:
            pass

    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, port


class Check:
    """The central, the agent and what was sent to them."""

    def __init__(self) -> None:
        advice_check.TMP = Path(os.environ.get("TMP_DIR", "/tmp/gwc-savings"))
        advice_check.BACKEND = BACKEND
        advice_check.recording_proxy = recording_proxy
        self.central = advice_check.Central(OUT / "savings_agent_output.jsonl")
        self.proxy_url = f"http://127.0.0.1:{self.central.proxy.server_address[1]}"
        self.registrations: list[dict[str, Any]] = []
        self.ends: list[dict[str, Any]] = []

    def start_job(self, job_id: str, gpus: list[str], pair: dict[str, Any]) -> None:
        """Register a job as the Slurm prolog does, with the pair's job key."""
        body = {
            "id": job_id,
            "user": "alice",
            "team": "team-savings",
            "project": "savings-check",
            "labels": {
                "name": f"train-{pair['pair']}",
                "account": "ml-research",
                "partition": "gpu",
                "script_sha256": sha256(pair["script"]),
            },
            "gpus": gpus,
            "started_at": advice_check.iso(time.time()),
            "exclusive": True,
        }
        c = self.central
        r = c.http.post("/api/v1/jobs", json=body, headers=c.headers("agent"))
        self.registrations.append({"body": body, "status": r.status_code})
        if r.status_code != 201:
            raise SystemExit(f"POST /jobs {job_id}: {r.status_code} {r.text}")

    def end_job(self, job_id: str) -> None:
        """End a job as the Slurm epilog does."""
        body = {"ended_at": advice_check.iso(time.time())}
        c = self.central
        r = c.http.patch(f"/api/v1/jobs/{job_id}", json=body, headers=c.headers("agent"))
        self.ends.append({"job": job_id, "body": body, "status": r.status_code})
        if r.status_code != 200:
            raise SystemExit(f"PATCH /jobs/{job_id}: {r.status_code} {r.text}")

    def job(self, job_id: str) -> dict[str, Any]:
        c = self.central
        page: dict[str, Any] = c.http.get(f"/api/v1/jobs/{job_id}", headers=c.headers()).json()
        return page

    def progress(self, job_id: str) -> dict[str, Any]:
        c = self.central
        got = c.http.get(f"/api/v1/jobs/{job_id}/progress", headers=c.headers())
        page: dict[str, Any] = got.json()
        return page


# --- the runs --------------------------------------------------------------------------------


def run_workload(check: Check, pair: dict[str, Any], phase: str, job_id: str) -> dict[str, Any]:
    """A synthetic run as its own process in its job's environment; its own timing."""
    out = Path(advice_check.TMP) / f"run-{job_id.removeprefix('slurm:')}.json"
    mode = "fixed" if pair["kind"] == "fixed" else "progress"
    amount = FIXED_STEPS if mode == "fixed" else RUN_SECONDS
    env = dict(
        check.central.env,
        SLURM_JOB_ID=job_id.removeprefix("slurm:"),
        SLURM_JOB_USER="alice",
        GPUWARDEN_CENTRAL_URL=check.proxy_url,
        GPUWARDEN_API_TOKEN=check.central.agent_token,
    )
    t0 = time.time()
    r = subprocess.run(
        [sys.executable, str(WORKLOAD), f"{pair['cause']}:{phase}", mode, str(amount), str(out)],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    if r.returncode != 0 or not out.exists():  # recorded, and the other runs go on
        print(r.stdout[-3000:] + r.stderr[-3000:], flush=True)
        return {"start": t0, "end": time.time(), "error": r.stderr[-2000:]}
    timing: dict[str, Any] = json.loads(out.read_text())
    return timing


def run_upstream(check: Check, pair: dict[str, Any], phase: str, job_id: str) -> dict[str, Any]:
    """An upstream script, unpatched, for UPSTREAM_SECONDS in its job's environment; its printed
    step counter is sent as the job's progress (steps) and gives its own seconds per step."""
    from service.progress import ProgressReporter

    env = dict(
        check.central.env, SLURM_JOB_ID=job_id.removeprefix("slurm:"), SLURM_JOB_USER="alice",
        PYTHONUNBUFFERED="1",  # its lines as they are printed (the script prints a step's)
    )  # fmt: skip
    for k, v in pair.get("env", {}).items():
        env[k] = v + os.pathsep + env.get(k, "") if k == "PYTHONPATH" else v
    if BACKEND == "simulated":
        argv = [sys.executable, str(Path(__file__)), "--fake-upstream", pair["parse"], phase]
    else:
        argv = [sys.executable, str(pair["script"]), *pair[phase]]
    reporter = ProgressReporter(
        "steps", every_seconds=2.0, job_id=job_id, central_url=check.proxy_url,
        token=check.central.agent_token,
    )  # fmt: skip
    log_path = OUT / f"upstream_{pair['pair']}_{phase}.log"
    points: list[dict[str, float]] = []
    t0 = time.time()
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, cwd="/tmp",
    )  # fmt: skip

    def read() -> None:
        assert proc.stdout is not None
        with log_path.open("w") as log:
            for line in proc.stdout:
                now = time.time()
                log.write(f"{now:.3f} {line}")
                got = parse_line(pair["parse"], line)
                if got is not None:
                    points.append({"t": now, "steps": got[0], "mean": got[1]})
                    reporter.set(got[0])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=UPSTREAM_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the run is stopped, as scancel would
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=10)
    reporter.close()
    end = time.time()
    return {
        "start": t0, "end": end, "argv": [Path(argv[1]).name, *argv[2:]],
        "env": pair.get("env", {}), "returncode": proc.returncode, "printed": points,
        "steps": points[-1]["steps"] if points else 0, "steps_reported": reporter.total,
        "reports_sent": reporter.sent_count, **own_seconds_per_step(points),
    }  # fmt: skip


def card() -> dict[str, str]:
    def sh(cmd: str) -> str:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()

    return {
        "nvidia_smi_L": sh("nvidia-smi -L || true"),
        "nvidia_smi": sh(
            "nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max "
            "--format=csv || true"
        ),
        "versions": sh(
            f"{sys.executable} -c 'import torch, torchvision; print(torch.__version__, "
            "torchvision.__version__)' 2>&1 || true"
        ),
    }


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    synthetic_imagefolder()
    check = Check()
    result: dict[str, Any] = {
        "backend": BACKEND, "run_seconds": RUN_SECONDS, "upstream_seconds": UPSTREAM_SECONDS,
        "fixed_steps": FIXED_STEPS, "warm_seconds": WARM, **card(), "runs": [],
    }  # fmt: skip

    def save() -> None:
        result["registrations"] = check.registrations
        result["ends"] = check.ends
        (OUT / "savings_runs.json").write_text(json.dumps(result, indent=1, default=str))

    try:
        gpus = check.central.gpu_uuids()[:1]
        time.sleep(3)  # GPM primed
        n = 0
        for pair in pairs():
            for phase in ("before", "after"):
                job_id = f"slurm:{FIRST_JOB + n}"
                n += 1
                named = None
                if phase == "after":  # the fix GPU Warden named for the wasteful run
                    before = check.job(result["runs"][-1]["job"])
                    named = [(f["cause"], f["action"]) for f in before.get("recommendations", [])]
                check.start_job(job_id, gpus, pair)
                t0 = time.time()
                if pair["kind"] == "upstream":
                    timing = run_upstream(check, pair, phase, job_id)
                else:
                    timing = run_workload(check, pair, phase, job_id)
                check.end_job(job_id)
                run = dict(
                    timing, pair=pair["pair"], cause=pair["cause"], kind=pair["kind"],
                    phase=phase, job=job_id, job_start=t0, job_end=time.time(),
                    named_before_fix=named,
                )  # fmt: skip
                result["runs"].append(run)
                save()
                spu = timing.get("seconds_per_step") or timing.get("seconds_per_run")
                print(f"{pair['pair']}:{phase} done: {spu} s/unit", flush=True)
        time.sleep(3)
        check.central.stop_agent()
        result["jobs"] = {r["job"]: check.job(r["job"]) for r in result["runs"]}
        result["progress"] = {r["job"]: check.progress(r["job"]) for r in result["runs"]}
        save()
    finally:
        check.central.close()
    for r in result["runs"]:
        page = result["jobs"][r["job"]]
        s = page["summary"]
        top = (page.get("recommendations") or [{}])[0]
        print(
            f"{r['pair']:<24} {r['phase']:<6} held {s['held_seconds']:6.1f} s  "
            f"per unit {page.get('gpu_seconds_per_unit')}  top fix {top.get('cause')} "
            f"{top.get('saving_fraction')}"
        )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--fake-upstream":
        fake_upstream(sys.argv[2], sys.argv[3])
    else:
        main()
