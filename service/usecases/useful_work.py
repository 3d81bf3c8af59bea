"""The useful-work verdict applied to stored data (issue 47): every GPU one job held through the
last hold time is judged (service/core/useful_work.py) and, where the verdict is sham or hung,
its samples of that time take the cause, so rollups, reports, /metrics and policies show it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine

from service.context import ServiceContext
from service.core.useful_work import Kind, Rules, Verdict, judge
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


def judge_once(engine: Engine, settings: Settings, *, now: datetime) -> list[Judged]:
    """Judge the last hold time of every GPU one job held and store sham and hung time."""
    rules = rules_of(settings)
    start = now - timedelta(seconds=rules.hold_seconds)
    out = []
    with engine.begin() as conn:
        for w in useful_work_repo.windows(conn, start=start, end=now):
            v = judge(w.samples, w.host, w.progress, rules=rules, labels=w.labels)
            changed = 0
            if v.cause is not None:
                changed = useful_work_repo.mark_cause(
                    conn,
                    gpu_id=w.gpu_id,
                    cause=v.cause,
                    start=start,
                    end=now,
                    max_gap_seconds=settings.max_gap_seconds,
                )
                if changed:
                    log.info("GPU %s of job %s: %s: %s", w.uuid, w.job_id, v.kind, v.words)
            out.append(Judged(w.gpu_id, w.uuid, w.job_id, v, changed))
    return out


# The policy metrics whose ladder notices carry the verdict's evidence in words.
USEFUL_WORK_METRICS = frozenset({"cause:sham", "cause:hung"})


def job_evidence_words(ctx: ServiceContext, job_id: str, now: datetime) -> str | None:
    """The plain words of the sham or hung verdict on the job's GPUs over the last hold time
    (each GPU named where the job has several), None where none is sham or hung."""
    rules = rules_of(ctx.settings)
    start = now - timedelta(seconds=rules.hold_seconds)
    with ctx.engine.connect() as conn:
        mine = [
            w for w in useful_work_repo.windows(conn, start=start, end=now) if w.job_id == job_id
        ]
    said = []
    for w in mine:
        v = judge(w.samples, w.host, w.progress, rules=rules, labels=w.labels)
        if v.cause is not None:
            said.append(f"{w.uuid}: {v.words}" if len(mine) > 1 else v.words)
    return "; ".join(said) or None


def useful_work_once(ctx: ServiceContext) -> int:
    """The scheduler's job: judge now; returns how many GPUs' time became sham or hung."""
    judged = judge_once(ctx.engine, ctx.settings, now=ctx.clock())
    return sum(1 for j in judged if j.changed)


__all__ = [
    "USEFUL_WORK_METRICS",
    "Judged",
    "Kind",
    "job_evidence_words",
    "judge_once",
    "rules_of",
    "useful_work_once",
]
