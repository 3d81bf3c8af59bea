"""Reads for proven savings (issue 46): the runs of a work key with their GPUs, held GPU-seconds
and progress, and the runs that ended in a window (the ledger's later runs)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, delete, func, insert, select

from service.costs.savings import Calibration, LedgerPair, Saving, counts_in_ledger
from service.db.rows import BookedSaving
from service.db.schema import (
    gpus,
    job_gpus,
    job_progress,
    jobs,
    savings_calibration,
    work_savings,
)

BATCH = 5000  # ids bound per statement (SQLite binds at most 32,766)


@dataclass(frozen=True, slots=True)
class StoredRun:
    """A stored job as a run of its work: its row, its GPUs' models (one per GPU), its held
    GPU-seconds up to ``now`` and its progress (units advanced and unit; None where none)."""

    job: dict[str, Any]
    gpu_models: tuple[str, ...]
    gpu_seconds: float
    units: float | None
    unit: str | None


def _runs(conn: Connection, rows: list[dict[str, Any]], now: datetime) -> list[StoredRun]:
    """The runs of the job ``rows``: their intervals and progress read in batches."""
    ids = [r["id"] for r in rows]
    models: dict[str, dict[int, str]] = defaultdict(dict)
    held: dict[str, float] = defaultdict(float)
    progress: dict[str, tuple[float, str]] = {}
    for i in range(0, len(ids), BATCH):
        part = ids[i : i + BATCH]
        for r in conn.execute(
            select(job_gpus.c.job_id, job_gpus.c.gpu_id, gpus.c.model, job_gpus.c.started_at,
                   job_gpus.c.ended_at)
            .join(gpus, gpus.c.id == job_gpus.c.gpu_id)
            .where(job_gpus.c.job_id.in_(part))
        ):  # fmt: skip
            models[r.job_id][r.gpu_id] = r.model or "unknown"
            end = min(r.ended_at or now, now)
            held[r.job_id] += max(0.0, (end - r.started_at).total_seconds())
        c = job_progress.c
        for job_id, advanced, unit in conn.execute(
            select(c.job_id, func.max(c.value) - func.min(c.value), func.min(c.unit))
            .where(c.job_id.in_(part))
            .group_by(c.job_id)
        ):
            progress[job_id] = (float(advanced), str(unit))
    out = []
    for row in rows:
        units, unit = progress.get(row["id"], (None, None))
        out.append(
            StoredRun(
                job=row,
                gpu_models=tuple(m for _, m in sorted(models[row["id"]].items())),
                gpu_seconds=held[row["id"]],
                units=units,
                unit=unit,
            )
        )
    return out


# The latest runs of a key read at most: enough for the run before and the key's spread, and a
# job page stays one small read however often its work runs (a CronJob every minute).
RUNS_OF_KEY_MAX = 200


def runs_of_key(
    conn: Connection, *, key: str, start: datetime, end: datetime, now: datetime
) -> list[StoredRun]:
    """The latest ``RUNS_OF_KEY_MAX`` jobs of work key ``key`` that started in [start, end],
    oldest first."""
    rows = conn.execute(
        select(jobs)
        .where(and_(jobs.c.work_key == key, jobs.c.started_at >= start, jobs.c.started_at <= end))
        .order_by(jobs.c.started_at.desc(), jobs.c.id.desc())
        .limit(RUNS_OF_KEY_MAX)
    )
    return _runs(conn, [dict(r._mapping) for r in reversed(list(rows))], now)


def keys_ended_in(
    conn: Connection, *, start: datetime, end: datetime, job_ids: Collection[str] | None = None
) -> list[tuple[str, str]]:
    """(job id, work key) of the jobs with a work key that ended in [start, end), by end."""
    query = (
        select(jobs.c.id, jobs.c.work_key)
        .where(and_(jobs.c.work_key.is_not(None), jobs.c.ended_at >= start, jobs.c.ended_at < end))
        .order_by(jobs.c.ended_at, jobs.c.id)
    )
    if job_ids is not None:
        query = query.where(jobs.c.id.in_(sorted(job_ids)))
    return [(r.id, r.work_key) for r in conn.execute(query)]


def replace_calibration(conn: Connection, *, rows: list[Calibration], at: datetime) -> None:
    """Write the calibration table whole (in the caller's transaction)."""
    conn.execute(delete(savings_calibration))
    if rows:
        conn.execute(
            insert(savings_calibration),
            [
                {"cause": r.cause, "pairs": r.pairs, "median_promised": r.median_promised,
                 "median_realised": r.median_realised, "factor": r.factor, "computed_at": at}
                for r in rows
            ],
        )  # fmt: skip


def calibration(conn: Connection) -> list[Calibration]:
    """The stored calibration, by cause."""
    c = savings_calibration.c
    return [
        Calibration(r.cause, r.pairs, r.median_promised, r.median_realised, r.factor)
        for r in conn.execute(select(savings_calibration).order_by(c.cause))
    ]


def store_savings(
    conn: Connection, *, pairs: list[tuple[LedgerPair, datetime]], at: datetime
) -> None:
    """Store each pair's saving (with its later run's end), replacing what was stored for the
    same later runs."""
    if not pairs:
        return
    ids = [p.job_id for p, _ in pairs]
    for i in range(0, len(ids), BATCH):
        conn.execute(delete(work_savings).where(work_savings.c.job_id.in_(ids[i : i + BATCH])))
    conn.execute(
        insert(work_savings),
        [
            {
                "job_id": p.job_id, "compared_with": p.saving.compared_with, "team": p.team,
                "user": p.user, "project": p.project, "ended_at": ended,
                "fix_cause": p.saving.fix_cause, "verdict": p.saving.verdict,
                "booked": counts_in_ledger(p.saving),
                "promised_fraction": p.saving.promised_fraction,
                "realised_fraction": p.saving.realised_fraction,
                "promised_usd": p.saving.promised_usd, "realised_usd": p.saving.realised_usd,
                "computed_at": at,
            }
            for p, ended in pairs
        ],
    )  # fmt: skip


def applied_fix_causes(conn: Connection, *, job_ids: Collection[str]) -> dict[str, str]:
    """The cause whose fix each of ``job_ids`` already applies, by its stored saving (a named
    fix on a pair that was compared); runs without one are left out."""
    c = work_savings.c
    ids = sorted(job_ids)
    out: dict[str, str] = {}
    for i in range(0, len(ids), BATCH):
        rows = conn.execute(
            select(c.job_id, c.fix_cause).where(
                c.job_id.in_(ids[i : i + BATCH]),
                c.fix_cause.is_not(None),
                c.verdict != "not_compared",
            )
        )
        out.update({r.job_id: r.fix_cause for r in rows})
    return out


def stored_count(conn: Connection) -> int:
    """How many later runs have a stored saving."""
    return int(conn.execute(select(func.count()).select_from(work_savings)).scalar_one())


def stored_savings(conn: Connection, *, since: datetime) -> list[Saving]:
    """The stored savings of later runs that ended at or after ``since`` (the calibration's
    fields: cause, verdict, promised and realised shares)."""
    c = work_savings.c
    rows = conn.execute(
        select(c.job_id, c.compared_with, c.fix_cause, c.verdict, c.promised_fraction,
               c.realised_fraction, c.promised_usd, c.realised_usd)
        .where(c.ended_at >= since)
    )  # fmt: skip
    return [
        Saving(
            work_key="",
            compared_with=r.compared_with,
            unit="run",
            fix_cause=r.fix_cause,
            fix_share_before=0.0,
            fix_share_after=0.0,
            promised_fraction=r.promised_fraction,
            promised_usd=r.promised_usd,
            realised_fraction=r.realised_fraction,
            realised_usd=r.realised_usd,
            noise_fraction=None,
            verdict=r.verdict,
            reason=None,
        )
        for r in rows
    ]


def realised_by_team_and_cause(conn: Connection) -> dict[tuple[str, str], float]:
    """The booked realised savings (USD) of every stored later run, per (team, cause)."""
    c = work_savings.c
    rows = conn.execute(
        select(c.team, c.fix_cause, func.sum(c.realised_usd))
        .where(c.booked.is_(True))
        .group_by(c.team, c.fix_cause)
    )
    return {(team or "", cause or ""): float(usd or 0.0) for team, cause, usd in rows}


def booked_between(conn: Connection, *, start: datetime, end: datetime) -> list[BookedSaving]:
    """The booked stored savings of later runs that ended in [start, end): job id, owner,
    realised and promised USD."""
    c = work_savings.c
    rows = conn.execute(
        select(c.job_id, c.user, c.team, c.project, c.realised_usd, c.promised_usd)
        .where(c.booked.is_(True), c.ended_at >= start, c.ended_at < end)
        .order_by(c.job_id)
    )
    return [BookedSaving(*r) for r in rows]
