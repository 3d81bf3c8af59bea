"""Real-GPU check of the NVML backend (run on the device machine; see docs/gpu-check/README.md).

1. CPU per GPU per cycle: the bare nvidia-ml-py calls the agent makes (the floor) against the
   agent's whole cycle (backend + attribution + batch + gzip + HTTP to a mock central), and one
   `nvidia-smi --query-gpu` call per cycle, all in this one run.
2. The three-phase workload sampled by the agent every second, with process attribution; every
   batch the agent shipped is recorded.
Outputs go to the directory given as argv[1].
"""

import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pynvml

from service.collectors.agent import Agent, AgentConfig
from service.collectors.attribution import JobAttributor
from service.collectors.nvml import ENERGY_EVERY_CYCLES, NvmlBackend
from service.collectors.nvml_fields import GPM_FIELDS
from service.collectors.shipper import Shipper
from service.collectors.spool import Spool

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-check-out")
PHASE_SECONDS = float(os.environ.get("PHASE_SECONDS", "25"))
CYCLES = int(os.environ.get("TIMING_CYCLES", "150"))
GAP = 0.1  # GPM needs at least 0.1 s between samples


def cpu() -> float:
    return time.process_time()


def bare_floor(cycles: int) -> float:
    """CPU seconds per GPU per cycle of the bare calls for the agent's fields."""
    pynvml.nvmlInit()
    n = pynvml.nvmlDeviceGetCount()
    hs = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    bufs = [[pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()] for _ in hs]
    mgs = []
    for _ in hs:
        mg = pynvml.c_nvmlGpmMetricsGet_t()
        mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(GPM_FIELDS)
        for i, f in enumerate(GPM_FIELDS):
            mg.metrics[i].metricId = getattr(pynvml, f"NVML_GPM_METRIC_{f.gpm}")
        mgs.append(mg)
    for k, h in enumerate(hs):
        pynvml.nvmlGpmSampleGet(h, bufs[k][0])
    events = pynvml.nvmlEventSetCreate()
    for h in hs:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, events)
    total = 0.0
    for c in range(cycles):
        time.sleep(GAP)
        t = cpu()
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlEventSetWait_v2(events, 0)
        for k, h in enumerate(hs):
            cur, prev = bufs[k][(c + 1) % 2], bufs[k][c % 2]
            pynvml.nvmlGpmSampleGet(h, cur)
            mg = mgs[k]
            mg.sample1, mg.sample2 = prev, cur
            pynvml.nvmlGpmMetricsGet(mg)
            pynvml.nvmlDeviceGetUtilizationRates(h)
            pynvml.nvmlDeviceGetMemoryInfo(h)
            pynvml.nvmlDeviceGetPowerUsage(h)
            pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
            pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
            pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            if c % ENERGY_EVERY_CYCLES == 0:
                pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
        total += cpu() - t
    for b in bufs:
        for x in b:
            pynvml.nvmlGpmSampleFree(x)
    pynvml.nvmlEventSetFree(events)
    pynvml.nvmlShutdown()
    return total / cycles / n


def single_calls(reps: int = 50) -> dict[str, float]:
    """CPU ms per call of each NVML call, for the record."""
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    out = {}
    s1, s2 = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    mg = pynvml.c_nvmlGpmMetricsGet_t()
    mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = len(GPM_FIELDS)
    for i, f in enumerate(GPM_FIELDS):
        mg.metrics[i].metricId = getattr(pynvml, f"NVML_GPM_METRIC_{f.gpm}")
    pynvml.nvmlGpmSampleGet(h, s1)
    calls = {
        "nvmlGpmSampleGet": lambda: pynvml.nvmlGpmSampleGet(h, s2),
        "nvmlGpmMetricsGet_9": lambda: (
            setattr(mg, "sample1", s1),
            setattr(mg, "sample2", s2),
            pynvml.nvmlGpmMetricsGet(mg),
        ),
        "nvmlDeviceGetUtilizationRates": lambda: pynvml.nvmlDeviceGetUtilizationRates(h),
        "nvmlDeviceGetMemoryInfo": lambda: pynvml.nvmlDeviceGetMemoryInfo(h),
        "nvmlDeviceGetPowerUsage": lambda: pynvml.nvmlDeviceGetPowerUsage(h),
        "nvmlDeviceGetTemperature": lambda: pynvml.nvmlDeviceGetTemperature(h, 0),
        "nvmlDeviceGetClockInfo": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        "nvmlDeviceGetComputeRunningProcesses": lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(
            h
        ),
        "nvmlDeviceGetTotalEnergyConsumption": lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(
            h
        ),
    }
    for name, fn in calls.items():
        if name == "nvmlGpmSampleGet":
            time.sleep(GAP)
        fn()
        t = cpu()
        for _ in range(reps):
            fn()
        out[name] = (cpu() - t) / reps * 1000
    pynvml.nvmlGpmSampleFree(s1)
    pynvml.nvmlGpmSampleFree(s2)
    pynvml.nvmlShutdown()
    return out


SINK = """
import gzip, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
out = open(sys.argv[2], "ab")
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def do_POST(self):
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        out.write(gzip.decompress(raw) + b"\\n"); out.flush()
        body = b'{"samples_received":0,"processes_received":0,"gpus":0}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


class Sink:
    """A stand-in central service in its own process (its CPU is not the agent's)."""

    def __init__(self, record: Path) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.record = record
        self.proc = subprocess.Popen([sys.executable, "-c", SINK, str(self.port), str(record)])
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def batches(self) -> list[dict]:
        return [json.loads(line) for line in self.record.read_text().splitlines() if line]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def make_agent(tmp: Path, sink: Sink, interval: float) -> Agent:
    return Agent(
        config=AgentConfig(
            hostname="h200-check",
            labels={"site": "device"},
            interval_seconds=interval,
            dead_letter_path=tmp / "dead.jsonl",
        ),
        backend=NvmlBackend(),
        shipper=Shipper(central_url=sink.url, token="t"),
        spool=Spool(tmp / f"spool-{time.time()}.sqlite"),
        attributor=JobAttributor(),
    )


def agent_cycle(cycles: int, tmp: Path) -> tuple[float, float]:
    """CPU seconds per GPU per cycle: collect (backend, attribution, batch, gzip) and ship."""
    sink = Sink(tmp / f"cycle-{time.time()}.jsonl")
    agent = make_agent(tmp, sink, GAP)
    n = len(agent.backend.devices())
    time.sleep(GAP)
    agent.collect()  # the first poll primes GPM
    collect = ship = 0.0
    for _ in range(cycles):
        time.sleep(GAP)
        t0 = cpu()
        body = agent.collect()
        t1 = cpu()
        agent.deliver(body)
        ship += cpu() - t1
        collect += t1 - t0
    agent.close()
    got = len(sink.batches())
    sink.stop()
    assert got == cycles, (got, cycles)
    return collect / cycles / n, ship / cycles / n


SMI_FIELDS = (
    "utilization.gpu,utilization.memory,memory.used,memory.total,power.draw,"
    "temperature.gpu,clocks.sm,uuid,index,name"
)


def nvidia_smi(cycles: int) -> tuple[float, float]:
    """CPU and wall seconds of one `nvidia-smi --query-gpu` call."""
    cpu_total = wall_total = 0.0
    for _ in range(cycles):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        w = time.perf_counter()
        subprocess.run(
            ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
            check=True,
            capture_output=True,
        )
        wall_total += time.perf_counter() - w
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_total += (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return cpu_total / cycles, wall_total / cycles


def workload_run(tmp: Path) -> dict:
    sink = Sink(OUT / "agent_output.jsonl")
    agent = make_agent(tmp, sink, 1.0)
    env = dict(os.environ, SLURM_JOB_ID="4242", SLURM_JOB_USER="alice")
    phases_file = tmp / "phases.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("workload.py")),
            str(PHASE_SECONDS),
            str(phases_file),
        ],
        env=env,
    )
    # Sample every second while the workload runs (the agent's own fixed-rate loop).
    import threading

    t = threading.Thread(target=agent.run_forever, daemon=True)
    t.start()
    proc.wait()
    time.sleep(1.5)
    agent.stop()
    t.join(5)
    agent.close()
    phases = json.loads(phases_file.read_text())
    sink.stop()
    batches = sink.batches()
    summary = {}
    for ph in phases:
        # Skip the first 2 s of a phase: a GPM sample covers the second before it.
        lo, hi = ph["start"] + 2.0, ph["end"]
        rows, procs = [], []
        for b in batches:
            for s in b["samples"]:
                ts = datetime.fromisoformat(s["ts"].replace("Z", "+00:00")).timestamp()
                if lo <= ts <= hi:
                    rows.append(s["metrics"])
            for p in b["processes"]:
                ts = datetime.fromisoformat(p["ts"].replace("Z", "+00:00")).timestamp()
                if lo <= ts <= hi:
                    procs.append(p)

        def med(k: str) -> float | None:
            vals = [r[k] for r in rows if k in r]
            return round(statistics.median(vals), 3) if vals else None

        summary[ph["phase"]] = {
            "samples": len(rows),
            **{
                k: med(k)
                for k in (
                    "sm_active",
                    "tensor_active",
                    "dram_active",
                    "sm_occupancy",
                    "gr_engine_active",
                    "gpu_util",
                    "power_watts",
                    "fb_used_bytes",
                    "pcie_tx_bytes_per_second",
                )
            },
            "processes": sorted({(p["pid"], p["job_id"], p["user"]) for p in procs}),
        }
    return {"phases": phases, "summary": summary, "batches": len(batches)}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = Path("/tmp/gpucheck")
    tmp.mkdir(exist_ok=True)
    result: dict = {"started": datetime.now(UTC).isoformat()}
    smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    result["nvidia_smi_L"] = smi.stdout.strip()
    result["pynvml_version"] = getattr(pynvml, "__version__", None)
    result["single_call_cpu_ms"] = single_calls()
    floors, agents, ships = [], [], []
    for _ in range(3):  # interleave so drift hits both alike
        floors.append(bare_floor(CYCLES // 3))
        c, s = agent_cycle(CYCLES // 3, tmp)
        agents.append(c)
        ships.append(s)
    floor, agent = statistics.median(floors), statistics.median(agents)
    ship = statistics.median(ships)
    smi_cpu, smi_wall = nvidia_smi(30)
    result["timing"] = {
        "bare_floor_cpu_ms_per_gpu_cycle": floor * 1000,
        "agent_collect_cpu_ms_per_gpu_cycle": agent * 1000,
        "agent_collect_over_floor": agent / floor,
        "agent_ship_cpu_ms_per_gpu_cycle": ship * 1000,
        "agent_collect_and_ship_over_floor": (agent + ship) / floor,
        "agent_collect_and_ship_3_polls_per_request_over_floor": (agent + ship / 3) / floor,
        "floor_runs_ms": [f * 1000 for f in floors],
        "agent_collect_runs_ms": [a * 1000 for a in agents],
        "agent_ship_runs_ms": [a * 1000 for a in ships],
        "nvidia_smi_cpu_ms_per_call": smi_cpu * 1000,
        "nvidia_smi_wall_ms_per_call": smi_wall * 1000,
        "nvidia_smi_over_agent_cpu": smi_cpu / (agent + ship),
        "nvidia_smi_over_agent_cpu_3_polls_per_request": smi_cpu / (agent + ship / 3),
        "energy_every_cycles": ENERGY_EVERY_CYCLES,
    }
    print(json.dumps(result, indent=1), flush=True)
    result["workload"] = workload_run(tmp)
    (OUT / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result["workload"]["summary"], indent=1))


if __name__ == "__main__":
    main()
