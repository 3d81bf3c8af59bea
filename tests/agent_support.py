"""Helpers for agent tests: an agent on the simulated backend wired to a scripted clock."""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from service.collectors.agent import Agent, AgentConfig
from service.collectors.shipper import Shipper
from service.collectors.simulated import SimulatedBackend
from service.collectors.spool import Spool
from service.collectors.transport import StdlibTransport, TransportError
from service.delivery import RetryPolicy
from tests.support import FakeClock


def mock_shipper(
    answer: Callable[[httpx.Request], httpx.Response], url: str = "http://central"
) -> Shipper:
    """A shipper (token "t") whose every request ``answer`` answers, in process (no socket)."""
    return Shipper(
        central_url=url, token="t", client=httpx.Client(transport=httpx.MockTransport(answer))
    )


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


class RecordingTransport:
    """The production transport, noting each request's outcome and batch."""

    def __init__(self, wire: Wire) -> None:
        self.inner = StdlibTransport(timeout_seconds=10)
        self.wire = wire

    def post(
        self, url: str, body: bytes, headers: dict[str, str], method: str = "POST"
    ) -> tuple[int, str, str | None]:
        if method != "POST":  # a job end, not a batch
            return self.inner.post(url, body, headers, method)
        batch = json.loads(zlib.decompress(body, 16 + zlib.MAX_WBITS))
        try:
            status, text, retry_after = self.inner.post(url, body, headers)
        except TransportError:
            self.wire.calls.append((None, batch))
            raise
        self.wire.calls.append((status, batch))
        return status, text, retry_after

    def close(self) -> None:
        self.inner.close()


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
    batch_cycles: int = 1,
) -> Agent:
    return Agent(
        config=AgentConfig(
            hostname=hostname,
            labels={"rack": "r1"},
            interval_seconds=10.0,
            batch_cycles=batch_cycles,
            dead_letter_path=tmp / "dead-letter.jsonl",
            retry=RetryPolicy(base_seconds=5, cap_seconds=60),
        ),
        backend=backend,
        shipper=Shipper(central_url=url, token=token, transport=RecordingTransport(wire)),
        spool=Spool(tmp / "spool.sqlite", max_bytes=spool_max_bytes),
        clock=agent_clock or clock,
        monotonic=FakeMonotonic(clock),
    )
