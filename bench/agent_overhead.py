"""Agent overhead on the simulated backend: its own CPU per GPU per cycle, and RSS over time.

The agent's own share is everything but the backend poll: job attribution, batch building, gzip,
the HTTP client and, when the central service is down, the SQLite spool. Time is compressed:
cycles run back to back with a scripted clock, so an hour of 10 s cycles (360) takes seconds.

Run: .venv/bin/python bench/agent_overhead.py [--gpus 8] [--cycles 3000]
"""

from __future__ import annotations

import argparse
import gc
import logging
import resource
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from service.collectors.agent import Agent, AgentConfig
from service.collectors.attribution import JobAttributor
from service.collectors.shipper import Shipper
from service.collectors.simulated import SimulatedBackend
from service.collectors.spool import Spool


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


SINK = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
status = int(sys.argv[2])
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b'{"samples_received":0,"processes_received":0,"gpus":0}'
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def start_sink(status: int) -> tuple[subprocess.Popen[bytes], str]:
    """A stand-in central service in another process (its CPU is not the agent's)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", SINK, str(port), str(status)])
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}"


def make(tmp: Path, gpus: int, status: int, url: str, batch: int = 1) -> tuple[Agent, Clock]:
    clock = Clock()
    agent = Agent(
        config=AgentConfig(
            hostname="bench", labels={"rack": "r1"}, dead_letter_path=tmp / "dl", batch_cycles=batch
        ),
        backend=SimulatedBackend(hostname="bench", gpus=gpus, start=clock()),
        shipper=Shipper(central_url=url, token="t"),
        spool=Spool(tmp / f"spool-{status}.sqlite"),
        attributor=JobAttributor(proc_root=tmp),  # simulated pids: nothing to read
        clock=clock,
        monotonic=lambda: (clock.now - datetime(2026, 12, 2, tzinfo=UTC)).total_seconds(),
    )
    return agent, clock


def cpu_share(tmp: Path, gpus: int, cycles: int, status: int, batch: int) -> tuple[float, float]:
    """(agent-only ms, backend ms) of CPU per GPU per cycle, shipping to a local sink."""
    sink, url = start_sink(status)
    agent, clock = make(tmp, gpus, status, url, batch)
    backend = agent.backend
    inner = 0.0
    real_sample = backend.sample

    def timed(now: datetime):  # type: ignore[no-untyped-def]
        nonlocal inner
        t = time.process_time()
        snap = real_sample(now)
        inner += time.process_time() - t
        return snap

    backend.sample = timed  # type: ignore[method-assign]
    for _ in range(20):  # warm up
        agent.run_once()
        clock.now += timedelta(seconds=10)
    inner = 0.0
    gc.collect()
    t0 = time.process_time()
    for _ in range(cycles):
        agent.run_once()
        clock.now += timedelta(seconds=10)
    total = time.process_time() - t0
    agent.close()
    sink.terminate()
    sink.wait()
    per = 1000 / cycles / gpus
    return (total - inner) * per, inner * per


def rss_run(tmp: Path, gpus: int, cycles: int) -> list[tuple[int, float]]:
    sink, url = start_sink(200)
    agent, clock = make(tmp, gpus, 200, url, 3)
    points = [(0, rss_mb())]
    for k in range(1, cycles + 1):
        agent.run_once()
        clock.now += timedelta(seconds=10)
        if k % (cycles // 10) == 0:
            points.append((k, rss_mb()))
    agent.close()
    sink.terminate()
    sink.wait()
    return points


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--cycles", type=int, default=3000)
    ap.add_argument("--rss-cycles", type=int, default=3600, help="3600 cycles = 10 h at 10 s")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # the "central down" run logs every backoff otherwise
    tmp = Path(tempfile.mkdtemp(prefix="gw-bench-"))
    print(f"simulated backend, {args.gpus} GPUs, {args.cycles} cycles")
    runs = (
        (200, 1, "central up, a request per poll"),
        (200, 3, "central up, 3 polls a request (30 s)"),
        (503, 3, "central down, spooling"),
    )
    for status, batch, label in runs:
        own, backend = cpu_share(tmp, args.gpus, args.cycles, status, batch)
        print(
            f"  {label:38s} agent's own CPU {own:.3f} ms/GPU/cycle "
            f"(backend poll {backend:.3f} ms/GPU/cycle)"
        )
    points = rss_run(tmp, args.gpus, args.rss_cycles)
    print(f"RSS over {args.rss_cycles} cycles ({args.rss_cycles * 10 / 3600:.1f} h at 10 s):")
    print("  " + ", ".join(f"{k}:{mb:.1f}MB" for k, mb in points))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  peak RSS {peak:.1f} MB; growth after warm-up {points[-1][1] - points[1][1]:+.1f} MB")


if __name__ == "__main__":
    main()
