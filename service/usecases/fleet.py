"""The fleet now, as the console's first page shows it: every GPU with what it wasted today."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from service.costs.waste import summarize
from service.db import gpus_repo
from service.settings import Settings
from service.usecases.cost_report import attribute


@dataclass(frozen=True, slots=True)
class WastedToday:
    """Each GPU's wasted (unused) USD since ``day_start`` (None: unpriced), and how priced."""

    day_start: datetime
    by_uuid: dict[str, float | None]
    price_source: str
    warnings: list[str]


@dataclass
class WastedTodayCache:
    """The last WastedToday, reused for ``max_age_seconds`` (monotonic) within the same day.

    The dollars come from rollups that move every rollup interval; reusing them for that long
    keeps a 1,000-GPU fleet page to reading the GPUs' latest samples, most of the time.
    """

    max_age_seconds: float
    _entry: tuple[float, WastedToday] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, day_start: datetime) -> WastedToday | None:
        """The cached figures of ``day_start`` if fresh enough, else None."""
        entry = self._entry
        if entry is None or entry[1].day_start != day_start:
            return None
        return entry[1] if time.monotonic() - entry[0] < self.max_age_seconds else None

    def put(self, value: WastedToday) -> None:
        """Keep ``value`` as the latest figures."""
        with self._lock:
            self._entry = (time.monotonic(), value)


def wasted_today(conn: Connection, *, settings: Settings, now: datetime) -> WastedToday:
    """Each GPU's wasted USD since midnight UTC: the cost report's figures grouped by GPU, read
    from whole 1m buckets at the job edges as long reports do, without the seconds per cause."""
    day_start = now.replace(hour=0, minute=0, second=0, microsecond=0)
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
    return WastedToday(
        day_start,
        {uuid: s.unused_cost_usd if s.priced else None for uuid, s in by_gpu.items()},
        att.price_source,
        att.warnings,
    )


def fleet_now(
    conn: Connection,
    *,
    settings: Settings,
    now: datetime,
    cache: WastedTodayCache | None = None,
) -> dict[str, Any]:
    """Every GPU (as ``GET /gpus`` has it) with its wasted (unused) USD since midnight UTC."""
    day_start = now.replace(hour=0, minute=0, second=0, microsecond=0)
    wasted = cache.get(day_start) if cache is not None else None
    if wasted is None:
        wasted = wasted_today(conn, settings=settings, now=now)
        if cache is not None:
            cache.put(wasted)
    gpus = gpus_repo.list_gpus(conn)
    for gpu in gpus:
        gpu["wasted_today_usd"] = wasted.by_uuid.get(gpu["uuid"])
    return {
        "start": day_start,
        "now": now,
        "gpus": gpus,
        "wasted_today_usd": sum(v for v in wasted.by_uuid.values() if v is not None),
        "price_source": wasted.price_source,
        "warnings": wasted.warnings,
    }
