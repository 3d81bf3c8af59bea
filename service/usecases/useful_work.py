"""The useful-work verdict applied to stored data (issue 47): every GPU one job held through the
last hold time is judged (service/core/useful_work.py) and, where the verdict is sham or hung,
its samples of that time take the cause, so rollups, reports, /metrics and policies show it."""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, Engine

from service.context import ServiceContext
from service.core.diagnosis import Cause
from service.core.useful_work import (
    GpuPoint,
    HostPoint,
    Kind,
    OddGpu,
    Rules,
    Verdict,
    judge,
    odd_gpus,
    sole_holder,
)
from service.db import useful_work_repo
from service.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Judged:
    """One GPU's verdict: its id and uuid, the job, the verdict and the samples it changed."""

    gpu_id: int
    gpu_uuid: str
    job_id: str
    verdict: Verdict
    changed: int


def rules_of(settings: Settings) -> Rules:
    """The verdict's rules from the settings (the hold time and the idle threshold)."""
    return Rules(
        hold_seconds=settings.useful_work_hold_minutes * 60.0, idle=settings.idle_threshold
    )


def _window_of(s: useful_work_repo.GpuSeries, job_id: str, until: int) -> Window:
    """The samples of ``s`` up to index ``until`` (excluded) with the host readings of
    ``job_id``'s processes (and of processes no job was named for) up to the last of them."""
    upto = s.samples[until - 1].ts
    host = [h for j in (job_id, None) for h in s.host.get(j, ()) if h.ts <= upto]
    host.sort(key=lambda h: h.ts)
    progress = [r for r in s.progress.get(job_id, ()) if r[0] <= upto]
    return Window(s.samples[:until], host, progress)


@dataclass(frozen=True, slots=True)
class Window:
    """What one verdict reads: samples, host readings and progress readings, in time order."""

    samples: list[GpuPoint]
    host: list[HostPoint]
    progress: list[tuple[float, float]]


def judge_once(
    engine: Engine, settings: Settings, *, now: datetime, since: datetime | None = None
) -> list[Judged]:
    """Judge, for every sample of a GPU one job held that was taken after ``since`` (default:
    an evaluation interval and the longest gap a sample covers ago, so late batches count),
    the hold time ending at that sample, as the replay does; a sham or hung verdict gives
    that hold time's samples its cause. Returns each GPU's latest verdict."""
    rules = rules_of(settings)
    if since is None:
        since = now - timedelta(seconds=settings.eval_interval_seconds + settings.max_gap_seconds)
    lo = since.timestamp()
    out = []
    with engine.begin() as conn:
        for s in useful_work_repo.series(
            conn, start=since - timedelta(seconds=rules.hold_seconds), end=now
        ):
            latest: tuple[str, Verdict] | None = None
            marks: list[tuple[Cause, float, float]] = []
            first = bisect.bisect_right([p.ts for p in s.samples], lo)
            for i in range(first, len(s.samples)):
                ts = s.samples[i].ts
                job_id = sole_holder(s.holds, ts - rules.hold_seconds, ts)
                if job_id is None:
                    continue
                w = _window_of(s, job_id, i + 1)
                v = judge(w.samples, w.host, w.progress, rules=rules, labels=s.labels[job_id])
                latest = (job_id, v)
                if v.cause is not None:
                    if (
                        marks
                        and marks[-1][0] is v.cause
                        and marks[-1][2] >= ts - rules.hold_seconds
                    ):
                        marks[-1] = (v.cause, marks[-1][1], ts)
                    else:
                        marks.append((v.cause, ts - rules.hold_seconds, ts))
            if latest is None:
                continue
            changed = 0
            for cause, a, b in marks:
                changed += useful_work_repo.mark_cause(
                    conn,
                    gpu_id=s.gpu_id,
                    cause=cause,
                    start=datetime.fromtimestamp(a, UTC),
                    end=datetime.fromtimestamp(b, UTC),
                    max_gap_seconds=settings.max_gap_seconds,
                )
            job_id, v = latest
            if changed and v.cause is not None:
                log.info("GPU %s of job %s: %s: %s", s.uuid, job_id, v.kind, v.words)
            out.append(Judged(s.gpu_id, s.uuid, job_id, v, changed))
    return out


# The policy metrics whose ladder notices carry the verdict's evidence in words.
USEFUL_WORK_METRICS = frozenset({"cause:sham", "cause:hung"})


def job_evidence_words(ctx: ServiceContext, job_id: str, now: datetime) -> str | None:
    """The plain words of the sham or hung verdict on the job's GPUs over the last hold time
    (each GPU named where the job has several), None where none is sham or hung."""
    rules = rules_of(ctx.settings)
    start = now - timedelta(seconds=rules.hold_seconds)
    with ctx.engine.connect() as conn:
        every = useful_work_repo.series(conn, start=start, end=now)
    mine = [
        s
        for s in every
        if s.samples
        and sole_holder(s.holds, s.samples[-1].ts - rules.hold_seconds, s.samples[-1].ts) == job_id
    ]
    said = []
    for s in mine:
        w = _window_of(s, job_id, len(s.samples))
        v = judge(w.samples, w.host, w.progress, rules=rules, labels=s.labels[job_id])
        if v.cause is not None:
            said.append(f"{s.uuid}: {v.words}" if len(mine) > 1 else v.words)
    return "; ".join(said) or None


def job_odd_gpus(
    conn: Connection, settings: Settings, job_id: str, *, end: datetime
) -> list[OddGpu]:
    """The GPUs of ``job_id`` whose activity over the hold time ending at ``end`` departs
    from their peers' (a job on three or more GPUs; none otherwise)."""
    rules = rules_of(settings)
    start = end - timedelta(seconds=rules.hold_seconds)
    mine = useful_work_repo.series(conn, start=start, end=end, job_id=job_id)
    return odd_gpus({s.uuid: s.samples for s in mine}, rules)


def useful_work_once(ctx: ServiceContext) -> int:
    """The scheduler's job: judge now; returns how many GPUs' time became sham or hung."""
    judged = judge_once(ctx.engine, ctx.settings, now=ctx.clock())
    return sum(1 for j in judged if j.changed)


__all__ = [
    "USEFUL_WORK_METRICS",
    "Judged",
    "Kind",
    "job_evidence_words",
    "job_odd_gpus",
    "judge_once",
    "rules_of",
    "useful_work_once",
]
