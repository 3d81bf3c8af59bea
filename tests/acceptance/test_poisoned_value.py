"""Scenario: dcgm-exporter reports NaN power for 3 s; the node's telemetry never stops.

A fake dcgm-exporter on loopback serves two GPUs; a real ``gpuwarden agent`` process scrapes it
every 0.2 s and ships five polls a request to a real central service. For 3 s the power reads
NaN. The agent drops that one field from those samples (counted in its /metrics) and ships the
rest: every poll is stored, the NaN ones without power, later ones as before, and nothing waits
in the spool behind them or goes to the dead-letter file.
"""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import Engine, func, select

from service.api.app import create_app
from service.db.schema import gpus, samples
from service.settings import Settings
from tests.process_support import (
    fake_dcgm_exporter,
    scrape,
    start_agent,
    stop,
    value,
    wait_until,
)
from tests.support import free_port, live_server


def stored(engine: Engine) -> list[tuple[str, float | None, float | None]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(samples.c.ts, samples.c.power_watts, samples.c.sm_clock_hz)
            .join(gpus, gpus.c.id == samples.c.gpu_id)
            .where(gpus.c.uuid == "GPU-poison-0")
            .order_by(samples.c.ts)
        ).all()
    return [(r.ts.isoformat(), r.power_watts, r.sm_clock_hz) for r in rows]


def test_nan_power_for_three_seconds_costs_nothing_but_that_field(
    engine: Engine, settings: Settings, tokens: dict[str, str], tmp_path: Path
) -> None:
    app = create_app(settings, engine=engine)  # the real clock: the agent stamps real times
    metrics_port = free_port()
    with fake_dcgm_exporter() as exporter, live_server(app) as url:
        agent = start_agent(
            central_url=url,
            token=tokens["agent"],
            state=tmp_path,
            metrics_port=metrics_port,
            args=["--backend", "dcgm-exporter", "--dcgm-exporter-url", exporter.url,
                  "--node-name", "node-a", "--interval-seconds", "0.2", "--batch-seconds", "1"],
        )  # fmt: skip
        deepest = 0.0
        try:
            wait_until("the first stored samples", lambda: len(stored(engine)) >= 10)
            exporter.power = "NaN"
            poisoned_from = time.monotonic()
            while time.monotonic() - poisoned_from < 3:
                deepest = max(deepest, value(scrape(metrics_port), "gpuwarden_agent_spool_batches"))
                time.sleep(0.1)
            exporter.power = "305"
            healed = len(stored(engine))
            # Later samples keep arriving: within seconds, not after a backlog drains.
            wait_until(
                "samples after the NaN period",
                lambda: sum(1 for _, p, _ in stored(engine) if p == 305) >= 10,
                timeout=20,
            )
            m = scrape(metrics_port)
            deepest = max(deepest, value(m, "gpuwarden_agent_spool_batches"))
        finally:
            stop(agent)
    log = (tmp_path / "agent.log").read_text()
    rows = stored(engine)
    nan_polls = [r for r in rows if r[1] is None]
    # About 15 polls in 3 s at 0.2 s (fewer on a loaded machine); each stored, power absent.
    assert len(nan_polls) >= 5, log[-3000:]
    assert all(clock == 1.98e9 for _, _, clock in nan_polls)  # the rest of the sample shipped
    assert len(rows) > healed
    assert deepest <= 12, (deepest, log[-3000:])  # one batch of five and a little, never a queue
    assert value(m, "gpuwarden_agent_dead_letter_batches_total") == 0
    assert value(m, "gpuwarden_agent_set_aside_batches_total") == 0
    dropped = value(
        m, "gpuwarden_agent_dropped_fields_total", field="power_watts", reason="not finite"
    )
    assert dropped >= 2 * len(nan_polls) - 2  # both GPUs, each NaN poll
    assert not (tmp_path / "dead-letter.jsonl").exists()
    assert log.count("power_watts = nan") == 2  # said once per GPU and field
    with engine.connect() as conn:
        total = conn.execute(select(func.count()).select_from(samples)).scalar_one()
    assert total == 2 * len(rows)  # both GPUs, every poll
