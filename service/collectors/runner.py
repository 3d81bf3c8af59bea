"""Wiring for ``gpuwarden agent``, ``up`` and ``demo``: settings in, a running agent out."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import disable_created_metrics, make_wsgi_app

from service.collectors.agent import Agent, AgentConfig
from service.collectors.attribution import JobAttributor
from service.collectors.backend import Backend
from service.collectors.kubelet.podresources import PodResourcesClient
from service.collectors.mig import MigIdentities
from service.collectors.shipper import Shipper
from service.collectors.spool import Spool
from service.collectors.state_dir import StatePaths, state_paths
from service.collectors.telemetry import AgentTelemetry
from service.delivery import quiet_http_logs
from service.errors import ConfigError
from service.settings import Settings
from service.vocabulary import MAX_LABEL_KEY_CHARS
from service.wire import (
    MAX_LABEL_VALUE_CHARS,
    MAX_NODE_LABELS,
    control_problem,
)

log = logging.getLogger(__name__)


def parse_labels(text: str) -> dict[str, str]:
    """``"rack=r1,zone=a"`` as a dict within central's limits; ConfigError names the bad item.

    Refused at start-up rather than by central with every batch, which would dead-letter them.
    """
    out: dict[str, str] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise ConfigError(f"node_labels: {item!r} is not key=value")
        if len(key) > MAX_LABEL_KEY_CHARS:
            raise ConfigError(f"node_labels: key {key[:20]!r}... over {MAX_LABEL_KEY_CHARS} chars")
        if len(value) > MAX_LABEL_VALUE_CHARS:
            raise ConfigError(
                f"node_labels: value of {key!r} over {MAX_LABEL_VALUE_CHARS} characters"
            )
        problem = control_problem(key + value)
        if problem is not None:
            raise ConfigError(f"node_labels: {item!r} {problem}")
        out[key] = value
    if len(out) > MAX_NODE_LABELS:
        raise ConfigError(f"node_labels: {len(out)} labels, at most {MAX_NODE_LABELS}")
    return out


def node_name(settings: Settings) -> str:
    """The node this agent reports: GPUWARDEN_NODE_NAME, NODE_NAME, or the machine's short name."""
    return settings.node_name or socket.gethostname().split(".")[0]


def agent_state(
    settings: Settings, *, env: Mapping[str, str] | None = None, suffix: str = ""
) -> StatePaths:
    """The agent's state files under the one state directory the settings and environment name."""
    return state_paths(
        state_dir=settings.state_dir,
        env=os.environ if env is None else env,
        spool_path=settings.spool_path,
        dead_letter_path=settings.dead_letter_path,
        job_end_dir=settings.job_end_dir,
        suffix=suffix,
    )


def _mig_identities(state: StatePaths | None) -> MigIdentities:
    """MIG instance identities kept in the state directory (in memory without one)."""
    return MigIdentities(None if state is None else state.mig_instances)


def make_backend(
    settings: Settings,
    *,
    hostname: str,
    say: Callable[[str], None] = print,
    simulate_without_gpu: bool = False,
    state: StatePaths | None = None,
) -> Backend:
    """The backend the settings ask for; ``auto`` picks NVML when a GPU is present and says so.

    Without a GPU, ``auto`` falls back to a simulated fleet only where the caller allows it
    (``up`` and ``demo``); a node agent raises ConfigError instead of shipping invented data.
    """
    choice = settings.backend
    if choice == "auto":
        from service.collectors.nvml import gpu_present

        if gpu_present():
            say("backend auto: NVIDIA GPU found, using NVML")
            choice = "nvml"
        elif simulate_without_gpu:
            say("backend auto: no NVIDIA GPU found (NVML unavailable): using a simulated fleet")
            choice = "simulated"
        else:
            raise ConfigError(
                "backend auto: no NVIDIA GPU found (NVML did not load or lists no GPU). "
                "On a GPU node, check the driver and that the agent sees /dev/nvidia* "
                "(in Kubernetes: the nvidia runtime class or NVIDIA_VISIBLE_DEVICES=all); to "
                "read a running dcgm-exporter use --backend dcgm-exporter; for a simulated "
                "fleet ask for it with --backend simulated"
            )
    if choice == "nvml":
        from service.collectors.nvml import NvmlBackend

        return NvmlBackend(mig=_mig_identities(state))
    if choice == "dcgm-exporter":
        from service.collectors.dcgm_exporter import DcgmExporterBackend

        return DcgmExporterBackend(
            url=settings.dcgm_exporter_url, mig=_mig_identities(state), node=hostname
        )
    from service.collectors.simulated import SimulatedBackend

    return SimulatedBackend(hostname=hostname, gpus=5, start=datetime.now(UTC))


def build_agent(
    settings: Settings,
    *,
    backend: Backend,
    hostname: str,
    telemetry: AgentTelemetry | None = None,
    state: StatePaths | None = None,
) -> Agent:
    """An agent for ``backend`` shipping to the settings' central service."""
    state = state or agent_state(settings)
    state.directory.mkdir(parents=True, exist_ok=True)
    return Agent(
        config=AgentConfig(
            hostname=hostname,
            labels=parse_labels(settings.node_labels),
            interval_seconds=settings.interval_seconds,
            batch_cycles=max(1, round(settings.agent_batch_seconds / settings.interval_seconds)),
            dead_letter_path=state.dead_letter,
            job_end_dir=state.job_ends,
        ),
        backend=backend,
        shipper=Shipper(central_url=settings.central_url, token=settings.agent_token),
        spool=Spool(state.spool, max_bytes=settings.spool_max_bytes),
        telemetry=telemetry or AgentTelemetry(),
        attributor=JobAttributor(
            proc_root=settings.proc_root,
            job_map_dir=settings.job_map_dir,
            pods=PodResourcesClient(settings.pod_resources_socket),
        ),
    )


def serve_metrics(
    telemetry: AgentTelemetry, *, host: str, port: int, stale_after_seconds: float = 60.0
) -> Any:
    """Serve the agent's /metrics and /healthz on ``host:port`` in a daemon thread.

    /healthz answers 200 while cycles keep ending (within ``stale_after_seconds``) and 503 once
    the loop is stuck, so a Kubernetes liveness probe restarts a wedged agent. Returns the server.
    """
    metrics_app = make_wsgi_app(telemetry.registry)

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") == "/healthz":
            ok = telemetry.alive(stale_after_seconds=stale_after_seconds)
            status = "200 OK" if ok else "503 Service Unavailable"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [b"ok\n" if ok else b"agent loop stalled\n"]
        return metrics_app(environ, start_response)

    server = make_server(host, port, app, _ThreadingWSGIServer, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="agent-metrics", daemon=True)
    thread.start()
    return server


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds would flood the log."""


def run_agent(settings: Settings) -> int:
    """Run the agent in the foreground until SIGINT or SIGTERM."""
    quiet_http_logs()
    hostname = node_name(settings)
    if not settings.agent_token:
        raise ConfigError("agent_token: set GPUWARDEN_AGENT_TOKEN or --agent-token")
    state = agent_state(settings)
    backend = make_backend(settings, hostname=hostname, state=state)
    agent = build_agent(settings, backend=backend, hostname=hostname, state=state)
    server = None
    if settings.agent_metrics_port:
        # No ``<counter>_created`` series (one per counter and label set, 32 of them): Prometheus
        # never reads them from this text format. The switch is process-wide, and this process
        # serves no registry but the agent's (the central drops them itself).
        disable_created_metrics()  # type: ignore[no-untyped-call]
        server = serve_metrics(
            agent.telemetry,
            host=settings.agent_metrics_host,
            port=settings.agent_metrics_port,
            stale_after_seconds=max(60.0, 3 * settings.interval_seconds),
        )
        print(
            f"agent metrics on http://{settings.agent_metrics_host}:"
            f"{settings.agent_metrics_port}/metrics"
        )
    print(
        f"agent for node {hostname}: backend {backend.name}, every {settings.interval_seconds:g} s"
        f" -> {settings.central_url} (state in {state.directory}, from {state.source})"
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
