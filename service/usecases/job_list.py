"""The jobs list: a page of the jobs that held GPUs in a window, each with its cost, waste and
top cause over it, ranked as the cost report by job ranks them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Connection

from service.db import jobs_repo
from service.roles import JobScope
from service.settings import Settings
from service.usecases.costing import cost_report

# The money figures each listed job carries (USD, and efficiency as a ratio).
LISTED_FIGURES = (
    "cost_usd", "waste_usd", "idle_usd", "fixable_usd", "lost_usd", "efficiency",
    "held_gpu_hours", "waste_gpu_hours",
)  # fmt: skip


class JobsPage(NamedTuple):
    """The page's jobs in order, how many jobs the whole list holds (``total``), and where
    the window read ends (before the end asked where today is read from its sums)."""

    jobs: list[dict[str, Any]]
    total: int
    end: datetime


def jobs_with_costs(
    conn: Connection,
    *,
    settings: Settings,
    start: datetime,
    end: datetime,
    now: datetime,
    user: str | None,
    team: str | None,
    sort: str,
    limit: int,
    offset: int = 0,
    scope: JobScope | None = None,
) -> JobsPage:
    """The jobs [offset, offset + limit) of those that held GPUs in [start, end) (of ``user``
    and ``team`` where given), largest ``sort`` USD first, each with its stored fields and its
    figures over that window; the figures and the order are the cost report's by job (whole
    days read from the day sums; only the jobs ``scope`` allows where given). Raises
    ValidationFailed naming ``sort`` or the range's field."""
    report = cost_report.cost_report(
        conn, settings=settings, start=start, end=end, now=now, group_by="job", user=user,
        team=team, sort_by=sort, limit=limit, offset=offset, jobs_only=True, scope=scope,
    )  # fmt: skip
    stored = jobs_repo.jobs_by_id(conn, job_ids=[row["key"] for row in report["rows"]])
    out: list[dict[str, Any]] = []
    for row in report["rows"]:
        job = stored.get(row["key"])
        if job is None:  # removed by retention between the two reads
            continue
        out.append(
            {
                **job,
                "labels": job.get("labels") or {},
                **{name: row.get(name) for name in LISTED_FIGURES},
                "top_cause": row.get("top_cause"),
            }
        )
    return JobsPage(out, report["row_count"], report["end"])
