"""``kill -9`` of the central service while a real agent ships: nothing is lost, nothing doubled.

Both are real ``gpuwarden`` processes on loopback; the agent spools through the outage and
replays when central is back on the same port. Bounded: about 20 s per store.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from sqlalchemy import Engine, func, select

from service.db.schema import samples
from service.settings import Settings
from tests.process_support import scrape, start_agent, start_central, stop, value, wait_until
from tests.support import free_port


def count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(samples)).scalar_one())


def test_central_killed_and_restarted_loses_no_sample(
    engine: Engine, settings: Settings, tokens: dict[str, str], tmp_path: Path
) -> None:
    port, metrics_port = free_port(), free_port()
    log = tmp_path / "central.log"
    central = start_central(settings.database_url, port, log)
    agent = start_agent(
        central_url=f"http://127.0.0.1:{port}",
        token=tokens["agent"],
        state=tmp_path,
        metrics_port=metrics_port,
        args=["--backend", "simulated", "--node-name", "node-a",
              "--interval-seconds", "0.2", "--batch-seconds", "0.6"],
    )  # fmt: skip
    try:
        wait_until("samples stored", lambda: count(engine) >= 30)
        stop(central, signal.SIGKILL)
        at_kill = count(engine)
        time.sleep(4)  # the agent polls on and spools
        spooled = value(scrape(metrics_port), "gpuwarden_agent_spool_batches")
        assert spooled >= 10
        central = start_central(settings.database_url, port, log)
        wait_until(
            "the spool to drain",
            lambda: (
                value(scrape(metrics_port), "gpuwarden_agent_spool_batches") <= 3
                and count(engine) > at_kill + 10 * 5
            ),
            timeout=60,
        )
        taken = value(scrape(metrics_port), "gpuwarden_agent_samples_collected_total")
    finally:
        stop(agent)  # SIGTERM: the agent ships what it holds, then exits
        stop(central)
    agent_log = (tmp_path / "agent.log").read_text()
    stored = count(engine)
    assert stored >= taken, agent_log[-2000:]  # every sample taken before the last look
    print(f"central kill -9: {taken:.0f} samples taken, {stored} stored ({at_kill} at the kill)")
    assert "central service unavailable" in agent_log
    assert not (tmp_path / "dead-letter.jsonl").exists()
