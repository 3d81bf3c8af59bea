"""Helpers for agent tests: an agent on the simulated backend wired to a scripted clock."""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from service.collectors.agent import Agent, AgentConfig
from service.collectors.shipper import Backoff, Shipper
from service.collectors.simulated import SimulatedBackend
from service.collectors.spool import Spool
from tests.support import FakeClock


class FakeMonotonic:
    """A monotonic clock that follows the scripted wall clock."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.origin = clock()

    def __call__(self) -> float:
        return (self.clock() - self.origin).total_seconds()


@dataclass
class Wire:
    """Every request the agent made: (status or None, decoded batch)."""

    calls: list[tuple[int | None, dict[str, Any]]] = field(default_factory=list)

    def accepted(self) -> list[dict[str, Any]]:
        return [b for s, b in self.calls if s == 200]


def recording_client(wire: Wire) -> httpx.Client:
    def on_response(response: httpx.Response) -> None:
        response.read()
        body = json.loads(zlib.decompress(response.request.content, 16 + zlib.MAX_WBITS))
        wire.calls.append((response.status_code, body))

    return httpx.Client(timeout=10, event_hooks={"response": [on_response]})


def make_agent(
    tmp: Path,
    *,
    url: str,
    token: str,
    clock: FakeClock,
    backend: SimulatedBackend,
    wire: Wire,
    hostname: str = "node-a",
    spool_max_bytes: int = 256 * 1024 * 1024,
    agent_clock: Any = None,
) -> Agent:
    return Agent(
        config=AgentConfig(
            hostname=hostname,
            labels={"rack": "r1"},
            interval_seconds=10.0,
            dead_letter_path=tmp / "dead-letter.jsonl",
        ),
        backend=backend,
        shipper=Shipper(central_url=url, token=token, client=recording_client(wire)),
        spool=Spool(tmp / "spool.sqlite", max_bytes=spool_max_bytes),
        clock=agent_clock or clock,
        monotonic=FakeMonotonic(clock),
        ship_backoff=Backoff(base_seconds=5, cap_seconds=60),
    )
