"""The jobs list: jobs that ran in a window, each with its cost, waste and top cause over it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from service.costs.assumptions import fix_assumptions_of
from service.costs.money import SORT_BYS, figures, sort_rows
from service.costs.recommend import with_model
from service.costs.waste import UNALLOCATED, summarize
from service.db import jobs_repo
from service.errors import ValidationFailed
from service.settings import Settings
from service.usecases import cost_report
from service.usecases.attribution import attribute

# The money figures each listed job carries (USD, and efficiency as a ratio).
LISTED_FIGURES = ("cost_usd", "waste_usd", "idle_usd", "fixable_usd", "lost_usd", "efficiency")


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
) -> list[dict[str, Any]]:
    """Jobs that ran in [start, end) with their figures over that window, largest ``sort``
    (USD) first; raises ValidationFailed naming ``sort`` or the range's field."""
    if sort not in SORT_BYS:
        raise ValidationFailed("sort", f"unknown sort {sort!r}; one of {SORT_BYS}")
    cost_report.check_range(settings, start=start, end=end, now=now)
    rows = jobs_repo.list_jobs(conn, start=start, end=end, user=user, team=team, limit=limit)
    att = attribute(conn, settings=settings, start=start, end=end, now=now)
    sums = summarize(att.lines, lambda ln: ln.job_id or UNALLOCATED)
    assumptions = fix_assumptions_of(settings)
    out: list[dict[str, Any]] = []
    for job in rows:
        s = sums.get(job["id"])
        models = [att.gpus[g].model for g in s.gpu_ids] if s else []
        d = figures(s, with_model(assumptions, models)) if s else {}
        out.append(
            {
                **job,
                "labels": job.get("labels") or {},
                **{name: d.get(name) for name in LISTED_FIGURES},
                "top_cause": d.get("top_cause"),
            }
        )
    return sort_rows(out, sort)
