"""The agent's own metrics: cycle time, errors, spool, drops and last push, in its own registry."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from service.delivery import Refusal
from service.families import OwnRegistry

# Every kind of agent error, each series started at 0 so increase() sees the first one.
ERROR_KINDS: tuple[str, ...] = (
    "backend",
    "cycle",
    "ship_network",
    *(f"ship_{r}" for r in Refusal),
    "dead_letter",
    "dead_letter_write",
)


class AgentTelemetry(OwnRegistry):
    """Counters and gauges the agent updates as it works; served on its optional /metrics port."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        counter, gauge, histogram = self.counter, self.gauge, self.histogram
        self.cycle_seconds = histogram(
            "gpuwarden_agent_cycle_duration_seconds",
            "Wall time of one collect-and-ship cycle.",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
        )
        self.errors = counter(
            "gpuwarden_agent_errors",
            f"Errors by kind ({', '.join(ERROR_KINDS)}).",
            ["kind"],
            zero=ERROR_KINDS,
        )
        self.spool_batches = gauge(
            "gpuwarden_agent_spool_batches", "Polls waiting in the on-disk spool."
        )
        self.spool_bytes = gauge(
            "gpuwarden_agent_spool_bytes", "Bytes of batches in the on-disk spool."
        )
        self.dropped = counter(
            "gpuwarden_agent_dropped_batches",
            "Oldest spooled polls dropped because the spool reached its size cap.",
        )
        self.dead_letters = counter(
            "gpuwarden_agent_dead_letter_batches",
            "Polls central refused for their content (4xx), written to the dead-letter file.",
        )
        self.splits = counter(
            "gpuwarden_agent_split_batches",
            "Batches refused whole and sent again poll by poll to find the bad one.",
        )
        self.set_aside = counter(
            "gpuwarden_agent_set_aside_batches",
            "Times a poll central kept failing on (5xx) was set aside behind newer ones.",
        )
        self.dropped_fields = counter(
            "gpuwarden_agent_dropped_fields",
            "Impossible metric values (NaN, inf, out of range, DCGM sentinel) dropped from a"
            " sample before shipping, by field and reason.",
            ["field", "reason"],
        )
        self.sent = counter("gpuwarden_agent_batches_sent", "Batches the central service accepted.")
        self.samples = counter("gpuwarden_agent_samples_collected", "GPU samples collected.")
        self.last_push = gauge(
            "gpuwarden_agent_last_successful_push_timestamp_seconds",
            "Unix time of the last batch the central service accepted.",
        )
        self.gpus = gauge("gpuwarden_agent_gpus", "GPUs the backend sees, by state.", ["state"])
        self.last_cycle = gauge(
            "gpuwarden_agent_last_cycle_timestamp_seconds",
            "Unix time the last collect-and-ship cycle ended (the liveness probe reads it).",
        )
        self.started_at = time.time()
        self.last_cycle_at: float | None = None

    def cycle_done(self, now: float | None = None) -> None:
        """Note that a cycle ended (Unix time ``now``, default the wall clock)."""
        self.last_cycle_at = time.time() if now is None else now
        self.last_cycle.set(self.last_cycle_at)

    def alive(self, *, stale_after_seconds: float, now: float | None = None) -> bool:
        """Whether a cycle ended within ``stale_after_seconds`` (or the agent only just started)."""
        now = time.time() if now is None else now
        last = self.last_cycle_at if self.last_cycle_at is not None else self.started_at
        return now - last <= stale_after_seconds
