"""Record three jobs sharing one GPU: GPM, processes and per-process utilisation, every second.

Run (repo root on PYTHONPATH; needs torch, numpy, nvidia-ml-py):
    PYTHONPATH=. SAMPLE_SECONDS=120 python3 docs/gpu-check/tenants_record.py OUT_DIR
Starts three workloads on GPU 0, each with its own fake Slurm job in its environment
(9101 busy bf16 matmul loop, 9102 input-starved training loop, 9103 idle holding 8 GiB), then
every second writes one JSON line per GPU to OUT_DIR/tenants_samples.jsonl: the NVML backend's
reading (GPM metrics as the agent reads them), nvmlDeviceGetComputeRunningProcesses,
nvmlDeviceGetProcessUtilization(handle, last_ts), nvmlDeviceGetProcessesUtilizationInfo
(NotSupported caught), and the CPU / wall time in ms of each call.
"""

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

JOBS = {"busy": "9101", "starved": "9102", "idle": "9103"}
GIB = 1024**3


def workload(kind: str, seconds: float, ready: Path) -> None:
    import numpy as np
    import torch

    dev = torch.device("cuda")
    end = time.time() + seconds
    if kind == "idle":
        x = torch.empty(8 * GIB, dtype=torch.uint8, device=dev)
        x.fill_(1)
        torch.cuda.synchronize()
        ready.write_text(str(time.time()))
        while time.time() < end:
            time.sleep(0.5)
        return
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    ready.write_text(str(time.time()))
    if kind == "busy":
        while time.time() < end:
            for _ in range(20):
                c = a @ a
            torch.cuda.synchronize()
        del c
        return
    # starved: ~60 ms of CPU "decoding" per step, then ~15 ms of bf16 matmuls
    raw = np.random.default_rng(0).integers(0, 255, size=(32, 3, 224, 224), dtype=np.uint8)
    while time.time() < end:
        t = time.perf_counter()
        while time.perf_counter() - t < 0.06:
            img = raw.astype(np.float32) / 255.0
            img = (img - img.mean()) / (img.std() + 1e-6)
        batch = torch.from_numpy(img).to(dev)
        for _ in range(8):
            c = a @ a
        c.add_(batch.mean())
        torch.cuda.synchronize()


def timed(fn, *args):
    c0, w0 = time.process_time(), time.perf_counter()
    try:
        val, err = fn(*args), None
    except Exception as exc:  # NVMLError: NotSupported, NotFound (no samples since last_ts)
        val, err = None, f"{type(exc).__name__}: {exc}"
    return val, err, (time.process_time() - c0) * 1e3, (time.perf_counter() - w0) * 1e3


def job_of(pid: int) -> str | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for kv in env:
        if kv.startswith(b"SLURM_JOB_ID="):
            return kv.split(b"=", 1)[1].decode()
    return None


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    seconds = float(os.environ.get("SAMPLE_SECONDS", "120"))
    import pynvml

    from service.collectors.nvml import NvmlBackend

    procs = {}
    for kind, job in JOBS.items():
        env = dict(os.environ, SLURM_JOB_ID=job, SLURM_JOB_USER=f"user{job}", CUDA_VISIBLE_DEVICES="0")
        ready = out / f".ready_{kind}"
        procs[kind] = subprocess.Popen(
            [sys.executable, __file__, "--workload", kind, str(seconds + 40), str(ready)], env=env
        )
    deadline = time.time() + 60
    while time.time() < deadline and not all((out / f".ready_{k}").exists() for k in JOBS):
        time.sleep(0.2)
    started = {k: float((out / f".ready_{k}").read_text()) for k in JOBS if (out / f".ready_{k}").exists()}
    meta = {
        "jobs": JOBS,
        "pids": {k: p.pid for k, p in procs.items()},
        "ready_unix": started,
        "pynvml_version": getattr(pynvml, "__version__", None),
    }
    backend = NvmlBackend()
    backend.open()
    lib = backend.lib
    meta["driver"] = lib.nvmlSystemGetDriverVersion()
    meta["devices"] = [asdict(d) for d in backend.devices()]
    last_ts: dict[int, int] = {}
    last_info_ts: dict[int, int] = {}
    gpm_bufs: dict[int, object] = {}
    time.sleep(1.0)
    with (out / "tenants_samples.jsonl").open("w") as f:
        f.write(json.dumps({"meta": meta}, default=str) + "\n")
        t_end = time.time() + seconds
        next_at = time.time()
        while time.time() < t_end:
            next_at += 1.0
            now = datetime.now(UTC)
            snap, err, cpu, wall = timed(backend.sample, now)
            base = {"ts": now.isoformat(), "backend_sample_cpu_ms": cpu, "backend_sample_wall_ms": wall,
                    "backend_error": err}
            for g in backend._gpus:
                idx = g.device.index
                rec = dict(base, gpu_uuid=g.device.uuid, gpu_index=idx)
                if snap is not None:
                    rec["reading"] = [asdict(r) for r in snap.readings if r.uuid == g.device.uuid]
                    rec["agent_processes"] = [asdict(p) for p in snap.processes if p.gpu_uuid == g.device.uuid]
                # GPM take alone, for its cost beside the per-process calls (own buffers)
                h = g.handle
                if g.gpm:
                    if idx not in gpm_bufs:
                        gpm_bufs[idx] = lib.nvmlGpmSampleAlloc()
                    _, err, cpu, wall = timed(lib.nvmlGpmSampleGet, h, gpm_bufs[idx])
                    rec["gpm_sample_get"] = {"cpu_ms": cpu, "wall_ms": wall, "error": err}
                rp, err, cpu, wall = timed(lib.nvmlDeviceGetComputeRunningProcesses, h)
                rec["running"] = {
                    "cpu_ms": cpu, "wall_ms": wall, "error": err,
                    "rows": [{"pid": int(p.pid), "used_bytes": getattr(p, "usedGpuMemory", None),
                              "job": job_of(int(p.pid))} for p in (rp or [])],
                }
                pu, err, cpu, wall = timed(getattr(lib, "nvmlDeviceGetProcessUtilization", None), h, last_ts.get(idx, 0))
                rows = [{"pid": int(s.pid), "ts_us": int(s.timeStamp), "sm": int(s.smUtil), "mem": int(s.memUtil),
                         "enc": int(s.encUtil), "dec": int(s.decUtil), "job": job_of(int(s.pid))} for s in (pu or [])]
                if rows:
                    last_ts[idx] = max(r["ts_us"] for r in rows)
                rec["proc_util"] = {"cpu_ms": cpu, "wall_ms": wall, "error": err, "rows": rows,
                                    "asked_since_us": last_ts.get(idx, 0)}
                fn = getattr(lib, "nvmlDeviceGetProcessesUtilizationInfo", None)
                if fn is None:
                    rec["procs_util_info"] = {"error": "absent from this pynvml"}
                else:
                    pi, err, cpu, wall = timed(fn, h, last_info_ts.get(idx, 0))
                    rows = []
                    samples = pi if isinstance(pi, list) else list(getattr(pi, "procUtilArray", None) or [])
                    for s in samples:
                        rows.append({k: int(getattr(s, k)) for k in
                                     ("pid", "timeStamp", "smUtil", "memUtil", "encUtil", "decUtil",
                                      "jpgUtil", "ofaUtil") if hasattr(s, k)})
                        rows[-1]["job"] = job_of(rows[-1].get("pid", 0))
                    if rows:
                        last_info_ts[idx] = max(r.get("timeStamp", 0) for r in rows)
                    rec["procs_util_info"] = {"cpu_ms": cpu, "wall_ms": wall, "error": err, "rows": rows}
                f.write(json.dumps(rec, default=str) + "\n")
            f.flush()
            time.sleep(max(0.0, next_at - time.time()))
    backend.close()
    for p in procs.values():
        p.terminate()
    for p in procs.values():
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
    print("done", json.dumps(meta, default=str))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--workload":
        workload(sys.argv[2], float(sys.argv[3]), Path(sys.argv[4]))
    else:
        main()
