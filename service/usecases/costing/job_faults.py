"""A job's hardware faults while it held its GPUs: hardware XIDs and GPUs that fell off the bus,
with the seconds and USD a lost GPU was held lost."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from service.costs.prices import PriceRow, price_at
from service.db import gpus_repo
from service.db.costing import costs_repo
from service.db.rows import JobRow
from service.settings import Settings
from service.usecases.costing.attribution import Attribution
from service.usecases.price_table import effective_prices

Span = tuple[int, datetime, datetime]  # a GPU held over [start, end]


@dataclass(frozen=True, slots=True)
class JobFault:
    """One hardware fault of a job's GPU while the job held it: an XID (``kind`` "xid") or the
    GPU off the bus ("lost": when it was reported lost, and the seconds and USD the job held
    it lost from then; USD None unpriced)."""

    gpu_uuid: str
    node: str
    gpu_index: int
    kind: str
    xid: int | None
    at: datetime
    lost_at: datetime | None
    lost_seconds: float | None = None
    lost_usd: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """The API's form of the fault (a report row's and a job page's ``faults``)."""
        return {
            "gpu_uuid": self.gpu_uuid, "node": self.node, "gpu_index": self.gpu_index,
            "kind": self.kind, "xid": self.xid, "at": self.at, "lost_at": self.lost_at,
            "lost_seconds": self.lost_seconds, "lost_usd": self.lost_usd,
        }  # fmt: skip


def report_faults(
    conn: Connection,
    att: Attribution,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    settings: Settings,
    gpu_ids: Iterable[int] | None = None,
) -> dict[str, list[JobFault]]:
    """Each job's hardware faults in a report's window on ``gpu_ids`` (every GPU of ``att`` if
    None): the 1h rollups' XIDs up to two hours before its end, finer reads after; the jobs'
    intervals read only for GPUs with a fault."""
    hourly = end.replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    end = min(end, now)
    found = gpus_repo.gpu_faults(
        conn,
        gpu_ids=sorted(att.gpus if gpu_ids is None else gpu_ids),
        start=start,
        end=end,
        hourly_before=hourly,
    )
    if not found:
        return {}
    allocations, _ = costs_repo.load_allocations(
        conn, start=start, end=end, now=now, gpu_ids=sorted({f.gpu_id for f in found})
    )
    spans_of: dict[str, list[Span]] = defaultdict(list)
    for al in allocations:
        # Cut to the window: a lost GPU's held seconds are the window's, as the row's lost_seconds.
        spans_of[al.job_id].append((al.gpu_id, max(al.start, start), min(al.end, end)))
    prices = effective_prices(conn, settings).rows
    return faults_of_jobs(conn, spans_of, prices=prices, settings=settings, hourly_before=hourly)


def job_faults(
    conn: Connection,
    *,
    job: JobRow,
    now: datetime,
    prices: Sequence[PriceRow],
    settings: Settings,
) -> list[JobFault]:
    """The hardware faults of the job's GPUs while it held them: each hardware XID (node, GPU
    index, code, first time) and each GPU that fell off the bus (its last sample, when it was
    reported lost, and the seconds and USD the job held it lost: from ``lost_at``)."""
    spans = [(iv["gpu_id"], iv["started_at"], min(iv["ended_at"] or now, now))
             for iv in job["intervals"]]  # fmt: skip
    return faults_of_jobs(conn, {job["id"]: spans}, prices=prices, settings=settings).get(
        job["id"], []
    )


def faults_of_jobs(
    conn: Connection,
    spans_of: dict[str, list[Span]],
    *,
    prices: Sequence[PriceRow],
    settings: Settings,
    hourly_before: datetime | None = None,
) -> dict[str, list[JobFault]]:
    """Each job's hardware faults (see ``job_faults``) on the GPUs it held over its spans, read
    in one pass over the GPUs (``hourly_before`` as ``gpus_repo.gpu_faults`` has it)."""
    spans = [s for spans in spans_of.values() for s in spans]
    if not spans:
        return {}
    grace = timedelta(seconds=settings.max_gap_seconds)  # a last sample stands this long
    faults = gpus_repo.gpu_faults(
        conn,
        gpu_ids=sorted({g for g, _, _ in spans}),
        start=min(a for _, a, _ in spans),
        end=max(z for _, _, z in spans) + grace,
        hourly_before=hourly_before,
    )
    out: dict[str, list[JobFault]] = {}
    for f in faults:
        for job_id, mine in spans_of.items():
            held = [
                (a, z) for g, a, z in mine
                if g == f.gpu_id and f.at + timedelta(seconds=f.within_seconds) >= a
                and f.at <= z + grace
            ]  # fmt: skip
            if held:
                out.setdefault(job_id, []).append(_fault_row(conn, f, held, prices))
    return out


def _fault_row(
    conn: Connection,
    f: gpus_repo.GpuFault,
    held: list[tuple[datetime, datetime]],
    prices: Sequence[PriceRow],
) -> JobFault:
    """The fault ``f`` of a job that held its GPU over ``held``, with what it held lost."""
    row = JobFault(f.uuid, f.node, f.gpu_index, "xid" if f.xid is not None else "lost", f.xid,
                   f.at, f.lost_at)  # fmt: skip
    if f.lost_at is None:
        return row
    seconds = sum(max((z - max(a, f.lost_at)).total_seconds(), 0.0) for a, z in held)
    price = price_at(prices, _model_of(conn, f.gpu_id), f.lost_at) if prices else None
    usd = None if price is None else seconds * price.usd_per_gpu_hour / 3600
    return replace(row, lost_seconds=seconds, lost_usd=usd)


def _model_of(conn: Connection, gpu_id: int) -> str:
    info = costs_repo.load_gpus(conn, gpu_ids=[gpu_id]).get(gpu_id)
    return info.model if info is not None else ""
