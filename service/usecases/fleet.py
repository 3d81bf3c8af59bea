"""The fleet now, as the console's first page shows it: every GPU with what it wasted today."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from service.costs.waste import summarize
from service.db import gpus_repo
from service.settings import Settings
from service.usecases.cost_report import attribute


def fleet_now(conn: Connection, *, settings: Settings, now: datetime) -> dict[str, Any]:
    """Every GPU (as ``GET /gpus`` has it) with its wasted (unused) USD since midnight UTC.

    The dollars are the cost report's, grouped by GPU, read from whole 1m buckets at the job
    edges (as long reports do) and without the seconds per cause, which this view does not show:
    that keeps a 1,000-GPU fleet in one request well under the console's time budget.
    """
    day_start = now.replace(hour=0, minute=0, second=0, microsecond=0)
    gpus = gpus_repo.list_gpus(conn)
    att = attribute(
        conn,
        settings=settings,
        start=day_start,
        end=now,
        now=now,
        raw_edges=False,
        causes=False,
    )
    by_gpu = summarize(att.lines, lambda line: att.gpus[line.gpu_id].uuid, jobs_only=False)
    wasted = {uuid: s.unused_cost_usd if s.priced else None for uuid, s in by_gpu.items()}
    for gpu in gpus:
        gpu["wasted_today_usd"] = wasted.get(gpu["uuid"])
    return {
        "start": day_start,
        "now": now,
        "gpus": gpus,
        "wasted_today_usd": sum(v for v in wasted.values() if v is not None),
        "price_source": att.price_source,
        "warnings": att.warnings,
    }
