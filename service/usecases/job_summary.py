"""A job's summary over its lifetime: totals and per GPU, recommendations with their savings,
energy and hardware faults (what a job alert says of it is ``usecases/verdict.py``'s)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import datetime
from functools import reduce
from operator import add
from typing import Any, TypedDict

from sqlalchemy import Connection

from service.core import diagnosis
from service.costs.assumptions import fix_assumptions_of
from service.costs.prices import PriceRow
from service.costs.recommend import Recommendation, total_saving_usd, with_model
from service.costs.rightsizing import GpuUse, recommend_job
from service.costs.waste import Summary, summarize
from service.db import jobs_repo
from service.db.costing import costs_repo
from service.db.rows import JobInterval, JobRow
from service.settings import Settings
from service.usecases.costing.attribution import Attribution
from service.usecases.costing.cost_report import JOULES_PER_KWH, report_row
from service.usecases.costing.dollars import DollarsQuery, dollars
from service.usecases.costing.job_faults import JobFault, job_faults
from service.usecases.price_table import effective_prices


class EnergyDoc(TypedDict):
    """A job's energy as the API has it (kWh, USD at the site's rate, per cause)."""

    kwh: float
    usd: float
    idle_kwh: float
    idle_usd: float
    usd_per_kwh: float
    source: str
    by_cause_kwh: dict[str, float]


@dataclass(frozen=True, slots=True)
class JobEnergy:
    """A job's energy in kWh and its cost in USD at ``usd_per_kwh``: all of it, the part burned
    while nothing ran (idle), and kWh per cause; ``source`` says what measured it."""

    kwh: float
    usd: float
    idle_kwh: float
    idle_usd: float
    usd_per_kwh: float
    source: str  # power, energy_counter, mixed or none
    by_cause_kwh: dict[str, float]

    @classmethod
    def of(
        cls, joules: float, by_cause_joules: dict[str, float], source: str, settings: Settings
    ) -> JobEnergy:
        """The energy of ``joules`` in all and ``by_cause_joules`` per cause, priced at the
        settings' ``energy_usd_per_kwh``."""
        rate = settings.energy_usd_per_kwh
        idle_joules = reduce(add, (by_cause_joules[c.label] for c in diagnosis.IDLE_CAUSES))
        idle = idle_joules / JOULES_PER_KWH
        return cls(
            kwh=joules / JOULES_PER_KWH,
            usd=joules / JOULES_PER_KWH * rate,
            idle_kwh=idle,
            idle_usd=idle * rate,
            usd_per_kwh=rate,
            source=source,
            by_cause_kwh={name: j / JOULES_PER_KWH for name, j in by_cause_joules.items()},
        )

    def as_dict(self) -> EnergyDoc:
        """The API's form of the energy."""
        return {
            "kwh": self.kwh,
            "usd": self.usd,
            "idle_kwh": self.idle_kwh,
            "idle_usd": self.idle_usd,
            "usd_per_kwh": self.usd_per_kwh,
            "source": self.source,
            "by_cause_kwh": self.by_cause_kwh,
        }


class JobSummaryDoc(TypedDict):
    """A job's summary as the API has it (EnergyPublic, PerGpuPublic and the rest validate it)."""

    summary: dict[str, Any]
    per_gpu: list[dict[str, Any]]
    energy: EnergyDoc
    recommendations: list[dict[str, object]]
    savings_usd: float | None
    faults: list[dict[str, Any]]
    warnings: list[str]


@dataclass(frozen=True, slots=True)
class JobSummary:
    """A job's waste summary over its lifetime: its report row (USD and seconds), one row per
    GPU, energy, recommendations, what they save in USD (None unpriced), faults and warnings."""

    summary: dict[str, Any]  # a report row, as cost_report.report_row has it
    per_gpu: list[dict[str, Any]]  # a report row per GPU with its gpu_uuid, by uuid
    energy: JobEnergy
    recommendations: list[Recommendation]
    savings_usd: float | None
    faults: list[JobFault]
    warnings: list[str]

    def as_dict(self) -> JobSummaryDoc:
        """The API's form of the summary (GET /api/v1/jobs/{id} adds the job's own fields)."""
        return {
            "summary": self.summary,
            "per_gpu": self.per_gpu,
            "energy": self.energy.as_dict(),
            "recommendations": [f.as_dict() for f in self.recommendations],
            "savings_usd": self.savings_usd,
            "faults": [f.as_dict() for f in self.faults],
            "warnings": self.warnings,
        }


def job_summary(conn: Connection, *, settings: Settings, job: JobRow, now: datetime) -> JobSummary:
    """The waste summary of one job over its lifetime: totals, per GPU, recommendations with
    their savings, and energy."""
    intervals = job["intervals"]
    gpu_ids = sorted({iv["gpu_id"] for iv in intervals})
    start = min([iv["started_at"] for iv in intervals], default=job["started_at"])
    ends = [iv["ended_at"] or job["ended_at"] or now for iv in intervals]
    end = min(max(ends, default=job["ended_at"] or now), now)
    per_gpu: dict[str, Summary] = {}
    total = Summary(job["id"])
    warnings: list[str] = []
    uses: list[GpuUse] = []
    prices: list[PriceRow] = []
    if gpu_ids and start < end:
        query = DollarsQuery(start, end, gpu_ids=tuple(gpu_ids), edges="raw", cause_energy=True)
        att = dollars(conn, query, settings=settings, now=now).attribution
        warnings = att.warnings
        prices = effective_prices(conn, settings).rows
        mine = [ln for ln in att.lines if ln.job_id == job["id"]]
        per_gpu = summarize(mine, lambda ln: att.gpus[ln.gpu_id].uuid)
        for summary in per_gpu.values():
            total.merge(summary)
        uses = _gpu_uses(conn, att, per_gpu, intervals, end=end)
        energy = _job_energy(conn, att, per_gpu, start=start, end=end, settings=settings)
    else:
        energy = JobEnergy.of(0.0, dict.fromkeys(diagnosis.CAUSE_NAMES, 0.0), "none", settings)
    assumptions = with_model(fix_assumptions_of(settings), [u.model for u in uses])
    fixes = recommend_job(total, uses, assumptions, prices=prices, when=end)
    return JobSummary(
        summary=report_row(total, settings, assumptions),
        per_gpu=[
            {**report_row(summary, settings, assumptions), "gpu_uuid": uuid}
            for uuid, summary in sorted(per_gpu.items())
        ],
        energy=energy,
        recommendations=list(fixes),
        savings_usd=total_saving_usd(fixes) if total.priced else None,
        faults=_with_lost_figures(
            job_faults(conn, job=job, now=now, prices=prices, settings=settings), per_gpu
        ),
        warnings=warnings,
    )


def _with_lost_figures(faults: list[JobFault], per_gpu: dict[str, Summary]) -> list[JobFault]:
    """The faults with a lost GPU's seconds and USD those of the job's summary on that GPU (its
    held seconds no sample covers after ``lost_at``), so the page and the bill say one figure."""
    out = []
    for f in faults:
        s = per_gpu.get(f.gpu_uuid)
        if f.kind == "lost" and s is not None:
            f = replace(f, lost_seconds=s.lost_seconds, lost_usd=s.lost_usd if s.priced else None)
        out.append(f)
    return out


# A counter reading whose mean power differs from the integrated power by more than this
# factor is not believed (a counter of another GPU, a reset missed): the power integral stays.
_COUNTER_PLAUSIBLE = 2.0
_COUNTER_MIN_SECONDS = 30.0  # readings closer than this say little about the mean power


def _job_energy(
    conn: Connection,
    att: Attribution,
    per_gpu: dict[str, Summary],
    *,
    start: datetime,
    end: datetime,
    settings: Settings,
) -> JobEnergy:
    """The job's energy: kWh, its cost, the part burned while nothing ran, and kWh per cause.

    Per GPU the power integrated over each cause's seconds, scaled to the GPU's energy counter
    where it has one: the counter's mean power between its first and last reading in the job
    over the integrated mean power (a counter misses no spike between two samples).
    """
    by_uuid = {info.uuid: info for info in att.gpus.values()}
    total = 0.0
    by_cause = dict.fromkeys(diagnosis.CAUSE_NAMES, 0.0)
    sources = set()
    counters = costs_repo.energy_counters(
        conn, gpu_ids=[by_uuid[uuid].id for uuid in per_gpu], start=start, end=end
    )
    for uuid, summary in per_gpu.items():
        u = summary.usage
        scale = 1.0
        source = "power"
        counter = counters.get(by_uuid[uuid].id)
        if counter and counter[1] >= _COUNTER_MIN_SECONDS and u.energy_used_joules > 0:
            ratio = (counter[0] / counter[1]) / (u.energy_used_joules / u.covered_seconds)
            if 1 / _COUNTER_PLAUSIBLE <= ratio <= _COUNTER_PLAUSIBLE:
                scale, source = ratio, "energy_counter"
        sources.add(source)
        total += scale * u.energy_used_joules
        for name, joules in u.cause_energy_joules().items():
            by_cause[name] += scale * joules
    source = sources.pop() if len(sources) == 1 else "mixed" if sources else "none"
    return JobEnergy.of(total, by_cause, source, settings)


def _gpu_uses(
    conn: Connection,
    att: Attribution,
    per_gpu: dict[str, Summary],
    intervals: list[JobInterval],
    *,
    end: datetime,
) -> list[GpuUse]:
    """Each GPU of the job with its model, memory size and the job's peaks on it: memory, DRAM
    activity, PCIe and NVLink rates (GPUs held over the same stretch are read together)."""
    by_uuid = {info.uuid: info for info in att.gpus.values()}
    totals = costs_repo.gpu_memory_totals(conn, gpu_ids=[info.id for info in by_uuid.values()])
    windows: dict[int, tuple[datetime, datetime]] = {}
    for iv in intervals:
        a, z = iv["started_at"], min(iv["ended_at"] or end, end)
        old = windows.get(iv["gpu_id"])
        windows[iv["gpu_id"]] = (min(a, old[0]), max(z, old[1])) if old else (a, z)
    by_window: dict[tuple[datetime, datetime], list[int]] = defaultdict(list)
    for gpu_id, window in windows.items():
        by_window[window].append(gpu_id)
    peaks: dict[int, dict[str, float]] = {}
    for (a, z), ids in by_window.items():
        if a < z:
            peaks.update(costs_repo.peak_usage(conn, gpu_ids=ids, start=a, end=z))
    out = []
    for uuid, summary in sorted(per_gpu.items()):
        info = by_uuid[uuid]
        total = totals.get(info.id)
        p = peaks.get(info.id, {})
        out.append(
            GpuUse(
                uuid, info.model, None if total is None else float(total),
                p.get("fb_used_bytes"), summary,
                peak_dram_active=p.get("dram_active"),
                peak_pcie_bytes_per_second=_busier(p, "pcie"),
                peak_nvlink_bytes_per_second=_busier(p, "nvlink"),
            )
        )  # fmt: skip
    return out


def _busier(peaks: dict[str, float], link: str) -> float | None:
    """The busier direction's peak rate of ``link`` (pcie, nvlink), None if neither reported."""
    rates = [peaks[k] for k in (f"{link}_tx_bytes_per_second", f"{link}_rx_bytes_per_second")
             if k in peaks]  # fmt: skip
    return max(rates) if rates else None


def job_waste_usd(
    conn: Connection, *, job_id: str, now: datetime, settings: Settings
) -> float | None:
    """The job's waste (waste_usd: idle + fixable, USD) so far; None if unknown or unpriced."""
    job = jobs_repo.get_job(conn, job_id=job_id)
    if job is None:
        return None
    value = job_summary(conn, settings=settings, job=job, now=now).summary["waste_usd"]
    return None if value is None else float(value)
