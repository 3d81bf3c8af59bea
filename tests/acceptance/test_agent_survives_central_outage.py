"""Scenario: the central service is stopped for a while and started again.

A node agent on the simulated backend keeps sampling every 10 s while the central service on
loopback is down; its batches go to the on-disk spool and are replayed, oldest first, when the
service is back. Every sample arrives exactly once and in order, and the agent never retried
faster than its backoff allows.
"""

from __future__ import annotations

import itertools
from datetime import datetime
from pathlib import Path

from fastapi import FastAPI
from sqlalchemy import Engine, select

from service.collectors.simulated import SimulatedBackend
from service.db.schema import gpus, samples
from tests.agent_support import Wire, make_agent
from tests.support import FakeClock, free_port, live_server


def test_every_sample_arrives_once_and_in_order_after_an_outage(
    app: FastAPI, engine: Engine, clock: FakeClock, tokens: dict[str, str], tmp_path: Path
):
    port = free_port()
    wire = Wire()
    backend = SimulatedBackend(
        hostname="node-a",
        gpus=3,
        scenarios=["training", "memory-bound", "idle-held"],
        start=clock(),
    )
    agent = make_agent(
        tmp_path,
        url=f"http://127.0.0.1:{port}",
        token=tokens["agent"],
        clock=clock,
        backend=backend,
        wire=wire,
    )

    def cycles(n: int) -> None:
        for _ in range(n):
            agent.run_once()
            clock.advance(10)

    with live_server(app, port=port):
        cycles(6)
    assert agent.spool.depth == 0
    cycles(60)  # ten minutes with the central service down
    assert agent.spool.depth >= 55  # everything since the outage waits on disk
    failed = agent.telemetry.registry.get_sample_value(
        "gpuwarden_agent_errors_total", {"kind": "ship_network"}
    )
    assert (
        failed is not None and 1 <= failed <= 16
    )  # backoff (cap 60 s): a few tries in ten minutes, not sixty
    with live_server(app, port=port):
        cycles(8)  # the next try comes within the backoff cap (60 s), then the spool drains
        assert agent.spool.depth == 0
    agent.close()

    # Exactly once: each accepted batch is distinct, and together they hold every poll.
    accepted = wire.accepted()
    stamps = [s["ts"] for b in accepted for s in b["samples"] if s["gpu_uuid"].endswith("0")]
    assert stamps == sorted(stamps)  # in order
    assert len(stamps) == len(set(stamps)) == 74  # once each, none missing
    with engine.connect() as conn:
        rows = conn.execute(
            select(gpus.c.uuid, samples.c.ts)
            .join(gpus, gpus.c.id == samples.c.gpu_id)
            .order_by(samples.c.ts)
        ).all()
    assert len(rows) == 74 * 3
    per_gpu: dict[str, list[datetime]] = {}
    for uuid, ts in rows:
        per_gpu.setdefault(uuid, []).append(ts)
    for got in per_gpu.values():
        assert len(got) == 74
        assert all((b - a).total_seconds() == 10 for a, b in itertools.pairwise(got))
