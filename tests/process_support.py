"""Real processes for the fault tests: central and agent as ``gpuwarden`` commands, and a fake
dcgm-exporter serving text on loopback. Every wait here is bounded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support import free_port


def wait_until(what: str, check: Callable[[], bool], *, timeout: float = 30.0) -> None:
    """Poll ``check`` every 50 ms until it is true; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 15) -> None:
    """Send ``sig`` to ``proc`` and wait for it (SIGKILL if it does not exit in time)."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def start_central(
    database_url: str, port: int, log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``gpuwarden serve`` on ``port`` over ``database_url``; returns once /healthz answers."""
    env = dict(os.environ, GPUWARDEN_DATABASE_URL=database_url, **(env or {}))
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1",
             "--port", str(port)],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def up() -> bool:
        assert proc.poll() is None, f"central exited: {log.read_text()[-2000:]}"
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until("central to answer /healthz", up, timeout=60)
    except BaseException:
        stop(proc, signal.SIGKILL)
        raise
    return proc


def start_agent(
    *, central_url: str, token: str, state: Path, metrics_port: int, args: list[str]
) -> subprocess.Popen[bytes]:
    """``gpuwarden agent`` with its spool, dead letters and log under ``state``."""
    env = dict(os.environ, GPUWARDEN_AGENT_TOKEN=token)
    with open(state / "agent.log", "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "service.cli", "agent",
             "--central-url", central_url,
             "--spool-path", str(state / "spool.sqlite"),
             "--dead-letter-path", str(state / "dead-letter.jsonl"),
             "--metrics-port", str(metrics_port),
             *args],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def agent_exposition(state: Path) -> str:
    """The text of a real agent's own /metrics once it has collected (simulated GPUs, no
    central: it spools), the agent stopped after."""
    port = free_port()
    agent = start_agent(
        central_url=f"http://127.0.0.1:{free_port()}", token="gw_agent_test", state=state,
        metrics_port=port,
        args=["--backend", "simulated", "--node-name", "node-a", "--interval-seconds", "0.2"],
    )  # fmt: skip
    try:

        def collected() -> bool:
            assert agent.poll() is None, (state / "agent.log").read_text()[-2000:]
            return value(scrape(port), "gpuwarden_agent_samples_collected_total") > 0

        wait_until("the agent's first samples on its /metrics", collected, timeout=60)
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        stop(agent)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The agent's /metrics as {(sample name, sorted labels): value}; empty if unreachable."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text  # 30 s: a hang
    except httpx.HTTPError:
        return {}
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def value(
    metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    """One sample of a scrape (0 when absent)."""
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


class FakeDcgmExporter:
    """A dcgm-exporter stand-in on loopback: two GPUs; ``power`` is the text of their power."""

    def __init__(self) -> None:
        self.power = "300"
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = outer.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def text(self) -> str:
        out = []
        for name, val in [
            ("DCGM_FI_DEV_GPU_UTIL", "42"),
            ("DCGM_FI_DEV_SM_CLOCK", "1980"),
            ("DCGM_FI_DEV_FB_USED", "20480"),
            ("DCGM_FI_DEV_FB_FREE", "60000"),
            ("DCGM_FI_DEV_POWER_USAGE", self.power),
        ]:
            out.append(f"# TYPE {name} gauge")
            for i in range(2):
                labels = (
                    f'gpu="{i}",UUID="GPU-poison-{i}",device="nvidia{i}",'
                    f'modelName="NVIDIA H100 80GB HBM3",Hostname="node-a"'
                )
                out.append(f"{name}{{{labels}}} {val}")
        return "\n".join(out) + "\n"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def fake_dcgm_exporter() -> Iterator[FakeDcgmExporter]:
    """A running FakeDcgmExporter, shut down afterwards."""
    exporter = FakeDcgmExporter()
    try:
        yield exporter
    finally:
        exporter.close()
