"""Wiring for ``gpuwarden agent``, ``up`` and ``demo``: settings in, a running agent out."""

from __future__ import annotations

import logging
import signal
import socket
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import start_http_server

from service.collectors.agent import Agent, AgentConfig
from service.collectors.attribution import JobAttributor
from service.collectors.backend import Backend
from service.collectors.shipper import Shipper
from service.collectors.spool import Spool
from service.collectors.telemetry import AgentTelemetry
from service.delivery import quiet_http_logs
from service.errors import ConfigError
from service.settings import Settings

log = logging.getLogger(__name__)


def parse_labels(text: str) -> dict[str, str]:
    """``"rack=r1,zone=a"`` as a dict; raises ConfigError naming the bad item."""
    out: dict[str, str] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"node_labels: {item!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


def node_name(settings: Settings) -> str:
    """The hostname this agent reports: GPUWARDEN_NODE_NAME or the machine's short name."""
    return settings.node_name or socket.gethostname().split(".")[0]


def make_backend(
    settings: Settings, *, hostname: str, say: Callable[[str], None] = print
) -> Backend:
    """The backend the settings ask for; ``auto`` picks NVML when a GPU is present and says so."""
    choice = settings.backend
    if choice == "auto":
        from service.collectors.nvml import gpu_present

        if gpu_present():
            say("backend auto: NVIDIA GPU found, using NVML")
            choice = "nvml"
        else:
            say("backend auto: no NVIDIA GPU found (NVML unavailable): using a simulated fleet")
            choice = "simulated"
    if choice == "nvml":
        from service.collectors.nvml import NvmlBackend

        return NvmlBackend()
    if choice == "dcgm-exporter":
        from service.collectors.dcgm_exporter import DcgmExporterBackend

        return DcgmExporterBackend(url=settings.dcgm_exporter_url)
    from service.collectors.simulated import SimulatedBackend

    return SimulatedBackend(hostname=hostname, gpus=5, start=datetime.now(UTC))


def build_agent(
    settings: Settings,
    *,
    backend: Backend,
    hostname: str,
    telemetry: AgentTelemetry | None = None,
    spool_path: Path | None = None,
    dead_letter_path: Path | None = None,
) -> Agent:
    """An agent for ``backend`` shipping to the settings' central service."""
    return Agent(
        config=AgentConfig(
            hostname=hostname,
            labels=parse_labels(settings.node_labels),
            interval_seconds=settings.interval_seconds,
            batch_cycles=max(1, round(settings.agent_batch_seconds / settings.interval_seconds)),
            dead_letter_path=dead_letter_path or settings.dead_letter_path,
        ),
        backend=backend,
        shipper=Shipper(central_url=settings.central_url, token=settings.agent_token),
        spool=Spool(spool_path or settings.spool_path, max_bytes=settings.spool_max_bytes),
        telemetry=telemetry or AgentTelemetry(),
        attributor=JobAttributor(proc_root=settings.proc_root, job_map_dir=settings.job_map_dir),
    )


def serve_metrics(telemetry: AgentTelemetry, *, host: str, port: int) -> Any:
    """Serve the agent's /metrics on ``host:port`` in a daemon thread; returns the server."""
    server, _thread = start_http_server(port, addr=host, registry=telemetry.registry)
    return server


def run_agent(settings: Settings) -> int:
    """Run the agent in the foreground until SIGINT or SIGTERM."""
    quiet_http_logs()
    hostname = node_name(settings)
    if not settings.agent_token:
        raise ConfigError("agent_token: set GPUWARDEN_AGENT_TOKEN or --agent-token")
    backend = make_backend(settings, hostname=hostname)
    agent = build_agent(settings, backend=backend, hostname=hostname)
    server = None
    if settings.agent_metrics_port:
        server = serve_metrics(
            agent.telemetry, host=settings.agent_metrics_host, port=settings.agent_metrics_port
        )
        print(
            f"agent metrics on http://{settings.agent_metrics_host}:"
            f"{settings.agent_metrics_port}/metrics"
        )
    print(
        f"agent for node {hostname}: backend {backend.name}, every {settings.interval_seconds:g} s"
        f" -> {settings.central_url} (spool {settings.spool_path})"
    )
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    try:
        agent.run_forever()
    except KeyboardInterrupt:
        pass
    finally:
        agent.close()
        if server is not None:
            server.shutdown()
            server.server_close()
    return 0
