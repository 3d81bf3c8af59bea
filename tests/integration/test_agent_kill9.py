"""``kill -9`` of a real ``gpuwarden agent`` process loses at most the poll it was taking."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Engine, func, select

from service.api.app import create_app
from service.collectors.agent import Agent, AgentConfig
from service.collectors.batch import decode
from service.collectors.shipper import Shipper
from service.collectors.simulated import SimulatedBackend
from service.collectors.spool import Spool
from service.db.schema import gpus, samples
from service.settings import Settings
from tests.process_support import scrape, start_agent, stop, value, wait_until
from tests.support import free_port, live_server


def test_spooled_batches_survive_kill_9_and_are_delivered_later(
    engine: Engine, settings: Settings, tokens: dict[str, str], tmp_path: Path
):
    port = free_port()  # nothing listens yet: the agent spools everything
    spool_path = tmp_path / "spool.sqlite"
    env = dict(os.environ, GPUWARDEN_AGENT_TOKEN=tokens["agent"])
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "service.cli", "agent",
            "--backend", "simulated",
            "--node-name", "node-a",
            "--central-url", f"http://127.0.0.1:{port}",
            "--interval-seconds", "0.2",
            "--batch-seconds", "0",
            "--spool-path", str(spool_path),
            "--dead-letter-path", str(tmp_path / "dl.jsonl"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if spool_path.exists():
                probe = Spool(spool_path)
                depth = probe.depth
                probe.close()
                if depth >= 8:
                    break
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with sqlite3.connect(spool_path) as db:  # every record whole, none torn
        bodies = [bytes(r[0]) for r in db.execute("SELECT body FROM batches ORDER BY id")]
    assert len(bodies) >= 8
    batches = [decode(b) for b in bodies]
    stamps = [b["samples"][0]["ts"] for b in batches]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)

    # A restarted agent on the same spool delivers all of it once the service is up.
    app = create_app(settings, engine=engine)  # the real clock: the agent stamped real times
    with live_server(app, port=port):
        agent = Agent(
            config=AgentConfig(hostname="node-a", labels={}, dead_letter_path=tmp_path / "d2"),
            backend=SimulatedBackend(hostname="node-a", gpus=1, start=datetime.now(UTC)),
            shipper=Shipper(central_url=f"http://127.0.0.1:{port}", token=tokens["agent"]),
            spool=Spool(spool_path),
        )
        agent.flush(30)
        assert agent.spool.depth == 0
        agent.close()
    with engine.connect() as conn:
        stored = conn.execute(select(func.count()).select_from(samples)).scalar_one()
    assert stored == sum(len(b["samples"]) for b in batches)


def test_kill_9_of_a_shipping_agent_loses_at_most_the_poll_it_was_taking(
    engine: Engine, settings: Settings, tokens: dict[str, str], tmp_path: Path
):
    """Polls are spooled as they are taken, so batching (here ten polls a request) costs none."""
    app = create_app(settings, engine=engine)
    metrics_port = free_port()
    stored = 0
    with live_server(app) as url:
        for round_ in range(3):  # killed at three different moments of its batching
            proc = start_agent(
                central_url=url,
                token=tokens["agent"],
                state=tmp_path,
                metrics_port=metrics_port,
                args=["--backend", "simulated", "--node-name", "node-a",
                      "--interval-seconds", "0.2", "--batch-seconds", "2"],
            )  # fmt: skip
            try:
                wait_until("the agent's metrics", lambda: bool(scrape(metrics_port)), timeout=30)
                time.sleep(1.0 + 0.7 * round_)
                m = scrape(metrics_port)
                taken = value(m, "gpuwarden_agent_samples_collected_total")
            finally:
                stop(proc, signal.SIGKILL)
            stored_before = stored
            # What the killed agent had taken is on disk: a restart on the spool ships it.
            agent = Agent(
                config=AgentConfig(hostname="node-a", labels={}, dead_letter_path=tmp_path / "d"),
                backend=SimulatedBackend(hostname="node-a", gpus=1, start=datetime.now(UTC)),
                shipper=Shipper(central_url=url, token=tokens["agent"]),
                spool=Spool(tmp_path / "spool.sqlite"),
            )
            agent.flush(30)
            assert agent.spool.depth == 0
            agent.close()
            with engine.connect() as conn:
                stored = conn.execute(select(func.count()).select_from(samples)).scalar_one()
                gpu_count = conn.execute(select(func.count()).select_from(gpus)).scalar_one()
            # The counter of the killed process, read just before the kill, may include the
            # poll it was writing: that one poll (a sample per GPU) is all a kill may cost.
            assert stored - stored_before >= taken - gpu_count, (round_, stored, taken)
