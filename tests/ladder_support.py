"""Helpers for the ladder tests: an idle-held policy with a ladder, a webhook channel on a real
receiver, idle or busy samples for a job's GPUs, and one round (evaluate, act, send)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine

from service.actions.base import (
    ProbeResult,
    ReclaimDriver,
    ReclaimResult,
    ReclaimTarget,
    SchedulerFacts,
)
from service.context import ServiceContext
from service.db import actions_repo, policies_repo
from service.thresholds.policy import parse_channel, parse_policy
from service.usecases.evaluation import evaluate_once
from service.usecases.ladder import LadderRoundResult, ladder_once
from service.usecases.outbox import Dispatcher
from service.usecases.upkeep import rollup_once
from tests.integration.cost_data import GIB, store_series
from tests.receivers import Receiver
from tests.support import FakeClock

IDLE_HELD = {"sm_active": 0.0, "gpu_util": 0.0, "fb_used_bytes": 20 * GIB}
BUSY = {"sm_active": 0.8, "gpu_util": 0.9, "tensor_active": 0.5, "fb_used_bytes": 20 * GIB}
# Princeton's ladder (warn at 60 and 105 minutes, reclaim at 120) shortened for the scripted
# clock: warn at 5 and 8 minutes, reclaim at 12.
STEPS = [
    {"action": "notify_owner", "after": "5m"},
    {"action": "notify_owner", "after": "8m"},
    {"action": "reclaim", "after": "12m"},
]


def idle_policy(ladder: Mapping[str, Any], channels: Sequence[str] = ("owners",)) -> dict[str, Any]:
    """A job policy on idle-held time (the whole minute idle with memory held), with ``ladder``."""
    return {
        "name": "idle-held-job", "metric": "idle_held", "aggregate": "min", "window": "1m",
        "op": ">=", "threshold": 1, "for": "0s", "scope": "job", "channels": list(channels),
        "repeat_interval": "24h", "ladder": dict(ladder),
    }  # fmt: skip


@dataclass
class RecordingDriver:
    """A reclaim driver standing in for a scheduler: answers as scripted, records each call."""

    name: str = "slurm"
    answers: list[ReclaimResult] = field(default_factory=list)
    calls: list[tuple[str, str, bool]] = field(default_factory=list)

    def reclaim(self, target: ReclaimTarget, *, dry_run: bool) -> ReclaimResult:
        self.calls.append((target.job_id, target.mode, dry_run))
        if dry_run:
            return ReclaimResult("would", f"would {target.mode} {target.job_id}")
        if self.answers:
            return self.answers.pop(0)
        return ReclaimResult("reclaimed", f"{target.mode} {target.job_id}")


@dataclass
class ProbingDriver(RecordingDriver):
    """A recording driver whose scheduler re-reads each job as ``found`` (by default: present,
    as registered, charged to ``account``), recording each target it was asked about."""

    account: str | None = "physics"
    found: ProbeResult | None = None
    probed: list[ReclaimTarget] = field(default_factory=list)

    def probe(self, target: ReclaimTarget) -> ProbeResult:
        self.probed.append(target)
        if self.found is not None:
            return self.found
        facts = SchedulerFacts(
            job_id=target.job_id, user=target.user, nodes=target.nodes, account=self.account,
            started_at=target.started_at,
        )  # fmt: skip
        return ProbeResult("present", f"{target.job_id} runs as registered", facts)


@dataclass
class LadderWorld:
    """One GPU fleet on the scripted clock: samples in, rounds run, notices to ``receiver``."""

    ctx: ServiceContext
    engine: Engine
    clock: FakeClock
    receiver: Receiver
    drivers: Mapping[str, ReclaimDriver]
    gpus: tuple[str, ...] = ("GPU-a0",)
    hostname: str = "node-a"

    def setup(self, ladder: Mapping[str, Any], **policy: Any) -> None:
        """The owners' webhook channel and the idle-held policy with ``ladder`` (and ``policy``'s
        fields changed)."""
        self.ctx.settings.webhook_allow_nets = "127.0.0.0/8"
        channel = parse_channel({"name": "owners", "type": "webhook", "url": self.receiver.url})
        with self.engine.begin() as conn:
            policies_repo.put_channel(conn, channel=channel, source="api", now=self.clock())
            policies_repo.put_policy(
                conn,
                policy=parse_policy(idle_policy(ladder) | policy),
                source="api",
                now=self.clock(),
            )

    def samples(self, minutes: float, metrics: Mapping[str, Any]) -> None:
        """``minutes`` of samples every 10 s on every GPU from now; the clock moves to the end."""
        start = self.clock()
        count = int(minutes * 6)
        for i, uuid in enumerate(self.gpus):
            store_series(
                self.engine, self.clock, uuid=uuid, index=i, start=start,
                metrics=[dict(metrics)] * count, hostname=self.hostname,
            )  # fmt: skip
        self.clock.set(start + timedelta(seconds=count * 10))

    def round(self) -> LadderRoundResult:
        """What the leader does each tick: roll up, evaluate, take due steps, send."""
        rollup_once(self.ctx)
        evaluate_once(self.ctx)
        result = ladder_once(self.ctx, drivers=self.drivers)
        Dispatcher(self.ctx).drain()
        return result

    def idle_for(self, minutes: int, metrics: Mapping[str, Any] = IDLE_HELD) -> None:
        """``minutes`` of samples, a round after each minute."""
        for _ in range(minutes):
            self.samples(1, metrics)
            self.round()

    def wait(self, minutes: int) -> None:
        """``minutes`` with no sample at all (the agent is down), a round after each minute."""
        for _ in range(minutes):
            self.clock.set(self.clock() + timedelta(minutes=1))
            self.round()

    def reasons(self, job_id: str, outcome: str) -> list[str]:
        """The reasons of the job's audit rows of ``outcome``, oldest first."""
        with self.engine.connect() as conn:
            rows = actions_repo.list_actions(conn, job_id=job_id, outcome=outcome)
        return [str(r["reason"]) for r in reversed(rows)]

    def actions(self, job_id: str) -> list[tuple[str, str]]:
        """The job's audit log, oldest first: (action, outcome)."""
        with self.engine.connect() as conn:
            rows = actions_repo.list_actions(conn, job_id=job_id)
        return [(r["action"], r["outcome"]) for r in reversed(rows)]

    def notices(self) -> list[dict[str, Any]]:
        """The ladder notices the receiver got, oldest first (their ``data``)."""
        return [
            r.json()["data"] for r in self.receiver.received if r.json()["type"] == "ladder.notice"
        ]
