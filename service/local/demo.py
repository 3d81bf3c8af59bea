"""What ``gpuwarden demo`` adds to its simulated fleet: teams, projects and alerts from history.

The simulated nodes report processes by user; the demo registers each job the way a Slurm
prolog would, with its user's team and a project, plus one allocation per empty GPU that runs
nothing (the waste no process list shows). Once the agents have shipped the hour of history,
the policies are evaluated at past times over it, so alerts whose ``for:`` is 15 or 30 minutes
are there at once, and their notifications say they come from history.

A restart on a database that already holds the fleet's history resumes it: the fleet keeps its
first start (its scenarios go on where they were) and only the gap since its last sample is
backfilled, so no recorded minute is written again.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine, func, select, type_coerce

from service.clock import Clock
from service.collectors.simulated import SimulatedBackend
from service.context import ServiceContext
from service.db import jobs_repo
from service.db.schema import gpus
from service.db.types import UTCDateTime
from service.usecases.evaluation import evaluate_once
from service.usecases.upkeep import rollup_once

log = logging.getLogger(__name__)

# Each simulated user's team and the projects their jobs belong to, in turn.
DEMO_TEAMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "user0": ("vision", ("detector-v2", "segmentation")),
    "user1": ("language", ("llm-finetune", "tokenizer")),
    "user2": ("platform", ("batch-inference",)),
}
# The demo's last-but-one node runs this much hotter (a rack whose cooling is failing), so its
# busy GPUs pass the hot-gpu policy's 85 C.
HOT_NODE_EXTRA_CELSIUS = 14.0
# How often the policies are evaluated over the history (a round per step).
REPLAY_STEP = timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class DemoJob:
    """One job of the demo: its user, team and project; ``gpu_uuid`` for an allocation that
    runs nothing (no process reports it, so it is registered with its GPU)."""

    job_id: str
    user: str
    team: str
    project: str
    gpu_uuid: str | None = None


def demo_jobs(backends: Sequence[SimulatedBackend]) -> list[DemoJob]:
    """Every job of the simulated fleet with its team and project, in node and GPU order."""
    out: list[DemoJob] = []
    for backend in backends:
        for device in backend.devices():
            k = device.index
            user = backend.user_of(k)
            team, projects = DEMO_TEAMS[user]
            project = projects[(len(out)) % len(projects)]
            job = backend.job_of(k)
            if job is not None:
                out.append(DemoJob(job, user, team, project))
            elif backend.scenarios[k] == "idle":
                out.append(DemoJob(backend.idle_job_of(k), user, team, project, device.uuid))
    return out


def register_jobs(
    engine: Engine, jobs: Sequence[DemoJob], *, started_at: datetime, now: datetime
) -> None:
    """Register ``jobs`` with their user, team and project, as a scheduler's prolog would."""
    with engine.begin() as conn:
        for j in jobs:
            jobs_repo.upsert_job(
                conn,
                job_id=j.job_id,
                fields={"user": j.user, "team": j.team, "project": j.project},
                gpu_uuids=[j.gpu_uuid] if j.gpu_uuid else [],
                started_at=started_at,
                ended_at=None,
                now=now,
            )


@dataclass(frozen=True, slots=True)
class DemoHistory:
    """What a demo run backfills: the fleet's start (its scenarios' time zero), the history
    shipped, [backfill_from, now), and whether it resumes a stored history."""

    fleet_start: datetime
    backfill_from: datetime
    now: datetime
    resumed: bool

    def says(self, database: str) -> str:
        """The console line saying whether the demo resumed or started its history, and what it
        backfills."""
        gap_minutes = (self.now - self.backfill_from).total_seconds() / 60
        if not self.resumed:
            return f"demo: a new history in {database}: backfilling {gap_minutes:.0f} min"
        return (
            f"demo: resuming the history in {database} (since {self.fleet_start:%Y-%m-%d %H:%M}Z);"
            f" nothing recorded is written again, backfilling only the gap since its last"
            f" sample ({gap_minutes:.1f} min)"
        )


def stored_span(engine: Engine, gpu_uuids: Sequence[str]) -> tuple[datetime, datetime] | None:
    """The first and last sample stored of any of ``gpu_uuids``, None if none has one."""
    with engine.connect() as conn:
        first, last = conn.execute(
            select(
                type_coerce(func.min(gpus.c.first_sample_at), UTCDateTime()),
                type_coerce(func.max(gpus.c.last_sample_at), UTCDateTime()),
            ).where(gpus.c.uuid.in_(list(gpu_uuids)))
        ).one()
    return None if first is None or last is None else (first, last)


def plan_history(
    stored: tuple[datetime, datetime] | None,
    *,
    now: datetime,
    history: timedelta,
    step: timedelta,
) -> DemoHistory:
    """A fresh history of ``history`` up to ``now``, or, over a stored one (``stored``: its
    first and last sample), the same fleet resumed: only the gap after the last sample, at most
    ``history`` of it (the rest stays no data)."""
    if stored is None:
        return DemoHistory(now - history, now - history, now, resumed=False)
    first, last = stored
    gap_from = min(max(last + step, now - history), now)
    return DemoHistory(first, gap_from, now, resumed=True)


def _fixed(at: datetime) -> Clock:
    return lambda: at


def replay_alerts(ctx: ServiceContext, *, start: datetime, end: datetime) -> int:
    """Roll up, then evaluate every policy at each REPLAY_STEP from ``start`` to ``end`` as if
    the service had run then; returns the notifications queued."""
    rollup_once(ctx)
    queued = 0
    at = start + REPLAY_STEP
    while at <= end:
        result = evaluate_once(dataclasses.replace(ctx, clock=_fixed(at)))
        queued += result.notifications
        at += REPLAY_STEP
    log.info("alerts replayed over the history: %d notifications", queued)
    return queued
