"""``gpuwarden up`` and ``gpuwarden demo``: the central service on SQLite plus local agents.

Both run uvicorn in the foreground and the agents in threads of the same process, creating the
tokens they need themselves, so one command shows GPUs, jobs and waste.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, func, insert, select

from service.collectors.agent import Agent, backfill
from service.collectors.backend import Backend
from service.collectors.runner import agent_state, build_agent, make_backend, node_name
from service.collectors.simulated import SCENARIOS, SimulatedBackend
from service.db import tokens_repo
from service.db.engine import make_engine
from service.db.migrate import upgrade
from service.db.schema import prices
from service.delivery import quiet_http_logs
from service.settings import Settings

DEMO_PRICE_USD_PER_GPU_HOUR = 4.0


@dataclass
class LocalNode:
    """One agent run by ``up`` or ``demo``, with the thread that drives it."""

    agent: Agent
    thread: threading.Thread | None = None


def _token(engine: Engine, role: str, node: str | None, name: str) -> str:
    with engine.begin() as conn:
        secret, _ = tokens_repo.create_token(
            conn, role=tokens_repo.Role(role), node=node, name=name, now=datetime.now(UTC)
        )
    return secret


def _start(
    node: LocalNode,
    *,
    ready: Callable[[], bool],
    history: tuple[datetime, datetime, float] | None = None,
) -> None:
    def work() -> None:
        deadline = time.monotonic() + 60
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.05)  # start shipping once the central service listens
        if history is not None:
            start, end, step = history
            backfill(node.agent, start=start, end=end, step_seconds=step, per_batch=60)
        node.agent.run_forever()

    node.thread = threading.Thread(target=work, name=f"agent-{node.agent.config.hostname}")
    node.thread.daemon = True
    node.thread.start()


def _serve(
    settings: Settings,
    engine: Engine,
    nodes: list[LocalNode],
    history: tuple[datetime, datetime, float] | None = None,
) -> int:
    import uvicorn

    from service.api.app import create_app, freeze_start_up_objects

    app = create_app(settings, engine=engine)
    freeze_start_up_objects()
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    for n in nodes:
        _start(n, ready=lambda: bool(server.started), history=history)
    try:
        server.run()
    finally:
        for n in nodes:
            n.agent.stop()
        for n in nodes:
            if n.thread is not None:
                n.thread.join(10)
            n.agent.close()
    return 0


def _banner(settings: Settings, reader: str) -> None:
    base = f"http://{settings.host}:{settings.port}"
    print(
        f"\nGPU Warden is up at {base}  (API docs: {base}/docs)\n"
        f"reader token: {reader}\n"
        f'  curl -s -H "Authorization: Bearer {reader}" {base}/api/v1/gpus\n'
        f'  curl -s -H "Authorization: Bearer {reader}" '
        f'"{base}/api/v1/reports/cost?group_by=job"\n'
        f"  metrics: {base}/metrics\n"
        "Ctrl-C stops the service and its agents.\n",
        flush=True,
    )


def _local_settings(settings: Settings) -> Settings:
    if not settings.is_sqlite:
        return settings
    return settings.model_copy(update={"central_url": f"http://{settings.host}:{settings.port}"})


def run_up(settings: Settings) -> int:
    """The central service on the configured database with one local agent (NVML or simulated)."""
    quiet_http_logs()
    settings = _local_settings(settings)
    engine = make_engine(settings.database_url)
    upgrade(engine)
    hostname = node_name(settings)
    state = agent_state(settings, suffix=hostname)
    backend: Backend = make_backend(
        settings, hostname=hostname, simulate_without_gpu=True, state=state
    )
    token = _token(engine, "agent", hostname, "gpuwarden up: local agent")
    reader = _token(engine, "reader", None, "gpuwarden up: local reader")
    agent = build_agent(
        settings.model_copy(update={"agent_token": token}),
        backend=backend,
        hostname=hostname,
        state=state,
    )
    node = LocalNode(agent)
    print(f"local agent for node {hostname} with the {backend.name} backend")
    _banner(settings, reader)
    return _serve(settings, engine, [node])


def run_demo(
    settings: Settings, *, nodes: int, gpus: int, history_minutes: float, seed: int
) -> int:
    """A simulated multi-node fleet with every scenario, an hour of history, then live data."""
    quiet_http_logs()
    settings = _local_settings(settings)
    engine = make_engine(settings.database_url)
    upgrade(engine)
    with engine.begin() as conn:
        if conn.execute(select(func.count()).select_from(prices)).scalar_one() == 0:
            conn.execute(
                insert(prices).values(
                    model_pattern="*H100*",
                    usd_per_gpu_hour=DEMO_PRICE_USD_PER_GPU_HOUR,
                    effective_from=datetime(2020, 1, 1, tzinfo=UTC),
                    note="gpuwarden demo",
                )
            )
    now = datetime.now(UTC)
    start = now - timedelta(minutes=history_minutes)
    # The demo's spools are throw-away: a fresh directory per run, whatever the environment says.
    settings = settings.model_copy(
        update={"state_dir": Path(tempfile.mkdtemp(prefix="gpuwarden-demo-"))}
    )
    local: list[LocalNode] = []
    for i in range(nodes):
        hostname = f"demo-node-{i}"
        # Rotate the scenarios per node so every node has a different mix and all appear.
        scen = [SCENARIOS[(i + k) % len(SCENARIOS)] for k in range(gpus)]
        backend = SimulatedBackend(
            hostname=hostname,
            gpus=gpus,
            seed=seed + i,
            scenarios=scen,
            start=start,
            xid_after_seconds=history_minutes * 60 * 0.5,
            lost_after_seconds=history_minutes * 60 * 0.75,
            job_base=1000 + 100 * i,
        )
        token = _token(engine, "agent", hostname, "gpuwarden demo")
        agent = build_agent(
            settings.model_copy(update={"agent_token": token, "node_labels": f"rack=r{i % 2}"}),
            backend=backend,
            hostname=hostname,
            state=agent_state(settings, env={}, suffix=hostname),
        )
        local.append(LocalNode(agent))
    reader = _token(engine, "reader", None, "gpuwarden demo: reader")
    print(
        f"demo: {nodes} simulated nodes x {gpus} GPUs ({', '.join(SCENARIOS)}), "
        f"{history_minutes:g} min of history, then live every {settings.interval_seconds:g} s; "
        f"price ${DEMO_PRICE_USD_PER_GPU_HOUR:.2f}/GPU-hour for *H100*"
    )
    _banner(settings, reader)
    return _serve(settings, engine, local, history=(start, now, settings.interval_seconds))
