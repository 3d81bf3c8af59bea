"""Agents on the dcgm-exporter backend scraping real captures, shipped into central as they
arrive."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import httpx

from service.collectors.agent import Agent, AgentConfig
from service.collectors.batch import build_batch
from service.collectors.dcgm_exporter import DcgmExporterBackend
from service.collectors.mig import MigIdentities
from service.collectors.shipper import Shipper
from service.collectors.spool import Spool
from service.context import ServiceContext
from service.usecases import ingest as ingest_service
from service.wire import IngestBatch, IngestResult
from tests.support import FakeClock

DATA = Path(__file__).resolve().parent / "data" / "dcgm-exporter"
STEP_SECONDS = 10
BATCH_POLLS = 6


def exporter_agent(state: Path, text: str, node: str, first_seen: datetime) -> Agent:
    """An agent of ``node`` on the dcgm-exporter backend, scraping an exporter that answers
    ``text``; it first sees each MIG instance at ``first_seen``."""
    client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200, text=text)))
    backend = DcgmExporterBackend(
        url="http://dcgm.test/metrics", client=client, mig=MigIdentities(clock=lambda: first_seen)
    )
    state.mkdir()
    return Agent(
        config=AgentConfig(hostname=node, labels={}, dead_letter_path=state / "dl"),
        backend=backend,
        shipper=Shipper(central_url="http://127.0.0.1:9", token="t"),
        spool=Spool(state / "spool.sqlite"),
    )


def ship_at_once(
    ctx: ServiceContext, clock: FakeClock, agents: dict[str, Agent], minutes: int
) -> dict[str, IngestResult]:
    """``minutes`` of every agent's polls from ``clock()`` on, their batches through central's
    ingest in turn as they arrive (the clock moves with them); each node's last result."""
    t0 = clock()
    last = {}
    for first in range(0, minutes * 60 // STEP_SECONDS, BATCH_POLLS):
        times = [t0 + timedelta(seconds=(first + k) * STEP_SECONDS) for k in range(BATCH_POLLS)]
        clock.set(times[-1] + timedelta(seconds=1))
        for node, agent in agents.items():
            snaps = [s for t in times if (s := agent.poll(t)) is not None]
            batch = build_batch(
                hostname=node, labels={}, devices=agent.backend.devices(), snapshots=snaps
            )
            last[node] = ingest_service.ingest(
                ctx, IngestBatch.model_validate(batch), token_node=node
            )
    return last
