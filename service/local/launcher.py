"""``gpuwarden up`` and ``gpuwarden demo``: the central service on SQLite plus local agents.

Both run uvicorn in the foreground and the agents in threads of the same process, creating the
tokens they need themselves, so one command shows GPUs, jobs and waste.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, func, insert, make_url, select

from service.collectors.agent import Agent, backfill
from service.collectors.backend import Backend
from service.collectors.runner import agent_state, build_agent, make_backend, node_name
from service.collectors.simulated import SCENARIOS, SimulatedBackend
from service.db import policies_repo
from service.db.engine import check_database, service_engine
from service.db.migrate import upgrade
from service.db.schema import prices
from service.delivery import quiet_http_logs
from service.errors import ConfigError
from service.local.demo import (
    HOT_NODE_EXTRA_CELSIUS,
    DemoHistory,
    DemoJob,
    demo_jobs,
    plan_history,
    register_jobs,
    replay_alerts,
    stored_span,
)
from service.local.run import (
    LocalRun,
    forget_running,
    local_database_url,
    record_running,
    state_dir,
)
from service.local.sink import LocalSink, start_local_sink
from service.local.tokens import own_tokens
from service.settings import Settings
from service.thresholds.default_policies import default_policies
from service.thresholds.policy import ChannelSpec
from service.usecases.config_check import check_config_file

if TYPE_CHECKING:
    from service.context import ServiceContext

log = logging.getLogger(__name__)
AfterHistory = Callable[["ServiceContext"], None]

DEMO_PRICE_USD_PER_GPU_HOUR = 4.0
NOTIFICATIONS_LOG = "notifications.log"
LOCAL_CHANNEL = "local-log"  # the channel of the default policies under up and demo
LOCAL_SOURCE = "local"  # policies and channels up and demo put in place themselves


@dataclass
class LocalNode:
    """One agent run by ``up`` or ``demo``, with the thread that drives it."""

    agent: Agent
    thread: threading.Thread | None = None
    history_shipped: threading.Event = field(default_factory=threading.Event)


def check_port_free(host: str, port: int) -> None:
    """ConfigError at once if ``host:port`` cannot be listened on (before any banner or token)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {host}:{port} ({exc.strerror or exc}): is another gpuwarden "
                "serve, up or demo running? Stop it, or pass --port"
            ) from None


def install_default_alerting(engine: Engine, sink_url: str) -> int:
    """The local-log channel at ``sink_url`` and the default policies sending to it.

    A policy of the same name made through the API or a config file is left as it is.
    """
    now = datetime.now(UTC)
    channel = ChannelSpec(name=LOCAL_CHANNEL, type="webhook", url=sink_url)
    with engine.begin() as conn:
        policies_repo.put_channel(conn, channel=channel, source=LOCAL_SOURCE, now=now)
        sources = policies_repo.policy_sources(conn)
        installed = 0
        for policy in default_policies(channels=[LOCAL_CHANNEL]):
            if sources.get(policy.name, LOCAL_SOURCE) == LOCAL_SOURCE:
                policies_repo.put_policy(conn, policy=policy, source=LOCAL_SOURCE, now=now)
                installed += 1
    return installed


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
        try:
            if history is not None:
                start, end, step = history
                backfill(node.agent, start=start, end=end, step_seconds=step, per_batch=60)
        finally:
            node.history_shipped.set()
        node.agent.run_forever()

    node.thread = threading.Thread(target=work, name=f"agent-{node.agent.config.hostname}")
    node.thread.daemon = True
    node.thread.start()


def _serve(
    settings: Settings,
    engine: Engine,
    nodes: list[LocalNode],
    history: tuple[datetime, datetime, float] | None = None,
    *,
    running: LocalRun,
    after_history: AfterHistory | None = None,
) -> int:
    from service.api.app import create_app, freeze_start_up_objects

    record = record_running(settings, running)
    try:
        return _run_server(
            settings, engine, nodes, history, create_app, freeze_start_up_objects, after_history
        )
    finally:
        forget_running(record, running.pid)
        print(stopped_message(settings, running, nodes), flush=True)


def _shown(path: Path) -> str:
    return str(path) if path.is_absolute() else f"./{path}"


def stopped_message(settings: Settings, running: LocalRun, nodes: list[LocalNode]) -> str:
    """What Ctrl-C on ``up``/``demo`` stopped and where the data it kept is (two lines)."""
    names = [n.agent.config.hostname for n in nodes]
    agents = f"{len(names)} agent{'s' if len(names) != 1 else ''} ({', '.join(names)})"
    state = state_dir(settings)
    url = make_url(running.database_url)
    if url.get_backend_name() == "sqlite" and url.database:
        database = Path(url.database)
        where = _shown(
            database.relative_to(Path.cwd()) if database.is_relative_to(Path.cwd()) else database
        )
    else:
        where = url.render_as_string(hide_password=True)
    again = "make up" if running.command == "up" else "gpuwarden demo"
    return (
        f"\ngpuwarden {running.command} stopped: the central service at {running.url} "
        f"and {agents}.\n"
        f"data kept in {_shown(state)}: the database {where}, alerts sent in "
        f"{_shown(state / NOTIFICATIONS_LOG)}; `{again}` starts again with them."
    )


def _run_server(
    settings: Settings,
    engine: Engine,
    nodes: list[LocalNode],
    history: tuple[datetime, datetime, float] | None,
    create_app: Any,
    freeze_start_up_objects: Callable[[], None],
    after_history: AfterHistory | None = None,
) -> int:
    import uvicorn

    app = create_app(settings, engine=engine)
    freeze_start_up_objects()
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        lifespan="on",
        proxy_headers=False,  # client addresses follow GPUWARDEN_TRUSTED_PROXIES
    )
    server = uvicorn.Server(config)
    for n in nodes:
        _start(n, ready=lambda: bool(server.started), history=history)
    if after_history is not None:
        _when_history_shipped(nodes, lambda: not server.should_exit, after_history, app.state.ctx)
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


def _when_history_shipped(
    nodes: list[LocalNode],
    running: Callable[[], bool],
    then: AfterHistory,
    ctx: ServiceContext,
) -> None:
    """Run ``then(ctx)`` in a thread once every agent has shipped its history."""

    def work() -> None:
        for n in nodes:
            while running() and not n.history_shipped.wait(0.5):
                pass
        if not running():
            return
        try:
            then(ctx)
        except Exception:  # the demo goes on with live data, without its history's alerts
            log.exception("the demo's history could not be evaluated")

    threading.Thread(target=work, name="demo-history", daemon=True).start()


def _banner(settings: Settings, reader: str, notifications: Path) -> None:
    base = f"http://{settings.host}:{settings.port}"
    print(
        f"\nGPU Warden is up at {base}  (API docs: {base}/docs)\n"
        f"console: {base}/  (log in with the reader token below)\n"
        f"reader token: {reader}\n"
        f'  curl -s -H "Authorization: Bearer {reader}" {base}/api/v1/gpus\n'
        "  .venv/bin/gpuwarden gpus            (this service and token are found by themselves)\n"
        "  .venv/bin/gpuwarden report cost --since 1h\n"
        f"alerts (default policies) are logged to {notifications}\n"
        "Ctrl-C stops the service and its agents.\n",
        flush=True,
    )


def _local_settings(settings: Settings, command: str) -> Settings:
    """Settings of ``up``/``demo``: their database, the agents' URL, the sink admitted."""
    database_url = local_database_url(settings, command)
    update: dict[str, Any] = {"database_url": database_url}
    if database_url.startswith("sqlite"):
        update["central_url"] = f"http://{settings.host}:{settings.port}"
    return settings.model_copy(update=update)


def _prepare(settings: Settings, command: str) -> tuple[Settings, Engine, Path, LocalSink]:
    """What ``up`` and ``demo`` share: the port checked first, the config, database, sink."""
    check_port_free(settings.host, settings.port)
    if settings.config is not None:
        check_config_file(settings.config)
    quiet_http_logs()
    settings = _local_settings(settings, command)
    state = state_dir(settings)
    state.mkdir(parents=True, exist_ok=True)
    engine = service_engine(settings)
    check_database(engine, allow_maintenance=settings.database_allow_maintenance)
    upgrade(engine)
    sink = start_local_sink(state / NOTIFICATIONS_LOG)
    # Loopback is refused for channels; this one URL, the sink's own, is admitted.
    settings = settings.model_copy(update={"local_sink_url": sink.url})
    install_default_alerting(engine, sink.url)
    return settings, engine, state, sink


def run_up(settings: Settings) -> int:
    """The central service on the configured database with one local agent (NVML or simulated)."""
    settings, engine, state, sink = _prepare(settings, "up")
    hostname = node_name(settings)
    agent_files = agent_state(settings, suffix=hostname)
    backend: Backend = make_backend(
        settings, hostname=hostname, simulate_without_gpu=True, state=agent_files
    )
    tokens = own_tokens(
        engine,
        state / "up-tokens.json",
        {
            "agent": ("agent", "gpuwarden up: local agent", hostname),
            "reader": ("reader", "gpuwarden up: local reader", None),
        },
    )
    agent = build_agent(
        settings.model_copy(update={"agent_token": tokens["agent"]}),
        backend=backend,
        hostname=hostname,
        state=agent_files,
    )
    node = LocalNode(agent)
    print(f"local agent for node {hostname} with the {backend.name} backend")
    _banner(settings, tokens["reader"], sink.log_path)
    running = _running("up", settings, tokens["reader"])
    return _serve(settings, engine, [node], running=running)


def _running(command: str, settings: Settings, reader: str) -> LocalRun:
    url = f"http://{settings.host}:{settings.port}"
    return LocalRun(command, os.getpid(), url, settings.database_url, reader)


def _demo_price(engine: Engine) -> None:
    """The demo's price for *H100*, unless the database already has prices."""
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


@dataclass(frozen=True, slots=True)
class DemoFleet:
    """What ``demo`` simulates: node and GPU counts, seed, and history from ``start``."""

    nodes: int
    gpus: int
    seed: int
    start: datetime
    history_minutes: float


def demo_hostnames(nodes: int) -> list[str]:
    """The demo's node names."""
    return [f"demo-node-{i}" for i in range(nodes)]


def plan_demo(
    engine: Engine, fleet: DemoFleet, *, now: datetime, step: timedelta
) -> tuple[DemoFleet, DemoHistory]:
    """The fleet to simulate and the history to ship: a new one, or, where the database holds
    this fleet's history already, the same fleet resumed with only the gap backfilled."""
    hostnames = demo_hostnames(fleet.nodes)
    uuids = [d.uuid for i, h in enumerate(hostnames) for d in demo_backend(fleet, i, h).devices()]
    history = plan_history(
        stored_span(engine, uuids),
        now=now,
        history=timedelta(minutes=fleet.history_minutes),
        step=step,
    )
    return dataclasses.replace(fleet, start=history.fleet_start), history


def demo_backend(fleet: DemoFleet, i: int, hostname: str) -> SimulatedBackend:
    """Node ``i`` of the demo's simulated backend."""
    # Continue the scenarios from node to node so the fleet shows every one (and so every
    # cause) as soon as it has as many GPUs as there are scenarios.
    gpus = fleet.gpus
    scen = [SCENARIOS[(i * gpus + k) % len(SCENARIOS)] for k in range(gpus)]
    history_seconds = fleet.history_minutes * 60
    return SimulatedBackend(
        hostname=hostname,
        gpus=gpus,
        seed=fleet.seed + i,
        scenarios=scen,
        start=fleet.start,
        xid_after_seconds=history_seconds * 0.75,  # XID 79, then off the bus for the last 15 min
        job_base=1000 + 100 * i,
        extra_celsius=HOT_NODE_EXTRA_CELSIUS if i == min(1, fleet.nodes - 1) else 0.0,
    )


def _demo_node(
    fleet: DemoFleet, i: int, hostname: str, token: str, spools: Settings
) -> tuple[LocalNode, SimulatedBackend]:
    """Node ``i`` of the demo: its simulated backend and the agent shipping it with ``token``."""
    backend = demo_backend(fleet, i, hostname)
    agent = build_agent(
        spools.model_copy(update={"agent_token": token, "node_labels": f"rack=r{i % 2}"}),
        backend=backend,
        hostname=hostname,
        state=agent_state(spools, env={}, suffix=hostname),
    )
    return LocalNode(agent), backend


def _demo_after_history(engine: Engine, jobs: list[DemoJob], history: DemoHistory) -> AfterHistory:
    """What the demo does once its history is shipped: jobs, alerts over it, then the scheduler."""

    def after_history(ctx: ServiceContext) -> None:
        # Teams and projects as a prolog registers them (from the fleet's first start: a resumed
        # demo's jobs keep theirs), then the policies over the history just shipped, then the
        # background jobs (held back so that no round runs at "now" in the meantime).
        register_jobs(engine, jobs, started_at=history.fleet_start, now=datetime.now(UTC))
        replay_alerts(ctx, start=history.backfill_from, end=datetime.now(UTC))
        from service.scheduler import start_scheduler

        sched = start_scheduler(ctx)
        ctx.shutdown_hooks.insert(0, lambda: sched.shutdown(wait=True))

    return after_history


def run_demo(
    settings: Settings, *, nodes: int, gpus: int, history_minutes: float, seed: int
) -> int:
    """A simulated multi-node fleet with every scenario, an hour of history, then live data."""
    settings, engine, state, sink = _prepare(settings, "demo")
    _demo_price(engine)
    now = datetime.now(UTC)
    fleet, history = plan_demo(
        engine,
        DemoFleet(nodes, gpus, seed, now - timedelta(minutes=history_minutes), history_minutes),
        now=now,
        step=timedelta(seconds=settings.interval_seconds),
    )
    hostnames = demo_hostnames(nodes)
    # The demo's spools are throw-away: a fresh directory per run, whatever the environment says.
    spools = settings.model_copy(
        update={"state_dir": Path(tempfile.mkdtemp(prefix="gpuwarden-demo-"))}
    )
    tokens = own_tokens(
        engine,
        state / "demo-tokens.json",
        {
            "reader": ("reader", "gpuwarden demo: reader", None),
            **{h: ("agent", "gpuwarden demo", h) for h in hostnames},
        },
    )
    made = [_demo_node(fleet, i, h, tokens[h], spools) for i, h in enumerate(hostnames)]
    local = [node for node, _ in made]
    reader = tokens["reader"]
    print(
        f"demo: {nodes} simulated nodes x {gpus} GPUs ({', '.join(SCENARIOS)}), "
        f"{history_minutes:g} min of history, then live every {settings.interval_seconds:g} s; "
        f"price ${DEMO_PRICE_USD_PER_GPU_HOUR:.2f}/GPU-hour for *H100*"
    )
    said = history.says(make_url(settings.database_url).render_as_string(hide_password=True))
    print(said, flush=True)
    log.info("%s", said)
    _banner(settings, reader, sink.log_path)
    jobs = demo_jobs([backend for _, backend in made])
    sink.history_until = now
    return _serve(
        settings.model_copy(update={"run_scheduler": False}),
        engine,
        local,
        (history.backfill_from, now, settings.interval_seconds),
        running=_running("demo", settings, reader),
        after_history=_demo_after_history(engine, jobs, history),
    )
