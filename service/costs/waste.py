"""The waste model over jobs: GPU timelines, sharing and costs.

Pure: takes allocation intervals, usage integrals and prices, returns report rows. When k jobs
hold one GPU at the same moment, every integral of that moment is split equally, 1/k to each,
so the jobs' shares add up to the GPU's time and nothing is counted twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from math import fsum
from operator import attrgetter
from typing import Literal, NamedTuple, get_args

from service.core.buckets import HOUR, MINUTE, ceil_to, floor_to
from service.core.diagnosis import Cause
from service.costs.integrals import CAUSE_FIELDS, Integrals

UNALLOCATED = "__unallocated__"


@dataclass(slots=True)
class Usage(Integrals):
    """The integrals of one GPU over some time, plus the tensor and DRAM activity sums/counts."""

    tensor_active_sum: float = 0.0
    tensor_active_count: float = 0.0
    dram_active_sum: float = 0.0
    dram_active_count: float = 0.0

    def add(self, other: Integrals, factor: float = 1.0) -> None:
        """Add ``factor`` times each field of ``other`` (an Integrals or a Usage) into this one."""
        Integrals.add(self, other, factor)  # not super(): slots dataclasses break its cell
        if isinstance(other, Usage):
            self.tensor_active_sum += factor * other.tensor_active_sum
            self.tensor_active_count += factor * other.tensor_active_count
            self.dram_active_sum += factor * other.dram_active_sum
            self.dram_active_count += factor * other.dram_active_count

    def scaled(self, factor: float) -> Usage:
        """A copy with every field multiplied by ``factor``."""
        out = Usage()
        out.add(self, factor)
        return out


# Base (integral) fields first, in Integrals' order: cost_sums maps query columns by position.
USAGE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Usage))
# A Summary's own summed figures (beside its usage and USD per cause).
_SUMMED = ("held_seconds", "cost_usd", "nodata_seconds", "lost_seconds", "nodata_usd",
           "lost_usd", "unpriced_seconds")  # fmt: skip


@dataclass(slots=True)  # not frozen: reports build tens of thousands, and frozen costs 3x
class Allocation:
    """A job holding a GPU over [start, end); intervals may overlap (api and observed)."""

    job_id: str
    gpu_id: int
    start: datetime
    end: datetime


@dataclass(slots=True)  # not frozen, like Allocation
class Segment:
    """A stretch [start, end) of one GPU during which the same set of jobs held it."""

    gpu_id: int
    start: datetime
    end: datetime
    job_ids: tuple[str, ...]


def _union(intervals: list[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    out: list[tuple[datetime, datetime]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def segment_gpu(
    gpu_id: int,
    allocations: Iterable[Allocation],
    start: datetime,
    end: datetime,
    cuts: Iterable[datetime] = (),
) -> list[Segment]:
    """Cut [start, end) of one GPU where its set of jobs (or a price, via ``cuts``) changes."""
    by_job: dict[str, list[tuple[datetime, datetime]]] = {}
    for a in allocations:
        s, e = max(a.start, start), min(a.end, end)
        if s < e:
            by_job.setdefault(a.job_id, []).append((s, e))
    # One (job, GPU) is counted once even if an api and an observed interval both cover it.
    events: dict[datetime, list[tuple[str, int]]] = {start: [], end: []}
    for job_id, intervals in by_job.items():
        for s, e in _union(intervals):
            events.setdefault(s, []).append((job_id, +1))
            events.setdefault(e, []).append((job_id, -1))
    for c in cuts:
        if start < c < end:
            events.setdefault(c, [])
    holding: set[str] = set()
    times = sorted(events)
    out: list[Segment] = []
    for i, t in enumerate(times[:-1]):
        for job_id, delta in events[t]:
            if delta > 0:
                holding.add(job_id)
            else:
                holding.discard(job_id)
        nxt = times[i + 1]
        if t < nxt:
            out.append(Segment(gpu_id, t, nxt, tuple(sorted(holding))))
    return out


@dataclass(frozen=True, slots=True)
class Read:
    """One part of a span: ``sign`` x the ``1h`` or ``1m`` buckets, or the ``raw`` samples,
    over [start, end)."""

    kind: str
    start: datetime
    end: datetime
    sign: int = 1


def _partial_hour(lo: datetime, hi: datetime) -> list[Read]:
    """Whole minutes [lo, hi) inside one hour: read directly, or as the hour minus the rest
    when that touches fewer 1m buckets (at most 30 either way)."""
    if hi - lo <= timedelta(minutes=30):
        return [Read("1m", lo, hi)]
    hour = floor_to(lo, HOUR)
    out = [Read("1h", hour, hour + HOUR)]
    for a, b in ((hour, lo), (hi, hour + HOUR)):
        if a < b:
            out.append(Read("1m", a, b, -1))
    return out


def plan_reads(start: datetime, end: datetime) -> list[Read]:
    """Split [start, end) into whole hours (1h), whole minutes at the edges (1m, each edge as
    few buckets as possible) and the seconds at the edges (raw); the signed parts add up."""
    if start >= end:
        return []
    m0, m1 = ceil_to(start, MINUTE), floor_to(end, MINUTE)
    if m0 >= m1:
        return [Read("raw", start, end)]
    h0, h1 = ceil_to(start, HOUR), floor_to(end, HOUR)
    out: list[Read] = []
    if h0 <= h1:
        if h0 < h1:
            out.append(Read("1h", h0, h1))
        for lo, hi in ((m0, h0), (h1, m1)):
            if lo < hi:
                out += _partial_hour(lo, hi)
    else:  # all inside one hour
        out += _partial_hour(m0, m1)
    for lo, hi in ((start, m0), (m1, end)):
        if lo < hi:
            out.append(Read("raw", lo, hi))
    return out


@dataclass(slots=True)
class Line:
    """One job's (or no job's) share of one GPU segment, with the price that held then;
    ``lost`` when the segment falls after the GPU was lost (fell off the bus)."""

    job_id: str | None
    gpu_id: int
    held_seconds: float
    usage: Usage
    usd_per_gpu_hour: float | None
    lost: bool = False


@dataclass(slots=True)
class Summary:
    """A group of lines summed: held seconds, usage, and USD (None if unpriced).

    The cost is every held second at its price: the covered seconds of each cause, the
    ``nodata`` seconds no sample covers and the ``lost`` seconds of a GPU fallen off the bus,
    so ``cost_usd`` = sum of ``cause_cost_usd`` + ``nodata_usd`` + ``lost_usd`` by construction.
    """

    key: str
    held_seconds: float = 0.0
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    nodata_seconds: float = 0.0
    lost_seconds: float = 0.0
    nodata_usd: float = 0.0
    lost_usd: float = 0.0
    unpriced_seconds: float = 0.0
    gpu_ids: set[int] = field(default_factory=set)
    job_ids: set[str] = field(default_factory=set)
    # USD per cause, in Cause order (like the ``<cause>_seconds`` fields of the usage).
    cause_cost_usd: list[float] = field(default_factory=lambda: [0.0] * len(CAUSE_FIELDS))

    def add_line(self, line: Line) -> None:
        """Add one line's seconds and dollars."""
        self.held_seconds += line.held_seconds
        self.usage.add(line.usage)
        self.gpu_ids.add(line.gpu_id)
        if line.job_id is not None:
            self.job_ids.add(line.job_id)
        u = line.usage
        uncovered = max(line.held_seconds - u.covered_seconds, 0.0)
        if line.lost:
            self.lost_seconds += uncovered
        else:
            self.nodata_seconds += uncovered
        if line.usd_per_gpu_hour is None:
            self.unpriced_seconds += max(line.held_seconds, u.covered_seconds)
            return
        per_second = line.usd_per_gpu_hour / 3600.0
        if line.lost:
            self.lost_usd += per_second * uncovered
        else:
            self.nodata_usd += per_second * uncovered
        self.cost_usd += per_second * (u.covered_seconds + uncovered)
        usd = self.cause_cost_usd
        for i, f in enumerate(CAUSE_FIELDS):
            seconds = getattr(u, f)
            if seconds:
                usd[i] += per_second * seconds

    def merge(self, other: Summary) -> None:
        """Add another summary into this one."""
        self.held_seconds += other.held_seconds
        self.usage.add(other.usage)
        self.cost_usd += other.cost_usd
        self.nodata_seconds += other.nodata_seconds
        self.lost_seconds += other.lost_seconds
        self.nodata_usd += other.nodata_usd
        self.lost_usd += other.lost_usd
        self.unpriced_seconds += other.unpriced_seconds
        for i, v in enumerate(other.cause_cost_usd):
            self.cause_cost_usd[i] += v
        self.gpu_ids |= other.gpu_ids
        self.job_ids |= other.job_ids

    @classmethod
    def total_of(cls, key: str, summaries: Iterable[Summary]) -> Summary:
        """One summary of all ``summaries``: what merging each in turn gives, summed a field at a
        time (a report's totals sum tens of thousands of rows) and correctly rounded."""
        parts = list(summaries)
        out = cls(key)
        if not parts:
            return out
        for name in _SUMMED:
            setattr(out, name, fsum(map(attrgetter(name), parts)))
        usages = [s.usage for s in parts]
        for name in USAGE_FIELDS:
            setattr(out.usage, name, fsum(map(attrgetter(name), usages)))
        out.cause_cost_usd = [
            fsum(column) for column in zip(*(s.cause_cost_usd for s in parts), strict=True)
        ]
        out.gpu_ids = set().union(*(s.gpu_ids for s in parts))
        out.job_ids = set().union(*(s.job_ids for s in parts))
        return out

    @property
    def priced(self) -> bool:
        """Whether every held second had a price (else costs are shown as null)."""
        return self.unpriced_seconds == 0

    def cause_usd(self, cause: Cause) -> float:
        """The USD of one cause's covered seconds (0 when unpriced)."""
        return self.cause_cost_usd[cause.column]

    def cause_seconds(self, cause: Cause) -> float:
        """The covered seconds of one cause."""
        return float(getattr(self.usage, CAUSE_FIELDS[cause.column]))

    @property
    def efficiency(self) -> float | None:
        """1 - unused/allocated, the time-weighted mean activity; None with no covered time."""
        cov = self.usage.covered_seconds
        return None if cov <= 0 else 1.0 - self.usage.unused_seconds / cov


def _is_lost(seg: Segment, lost_at: Mapping[int, datetime]) -> bool:
    """Whether the segment lies after its GPU was lost (segments are cut at ``lost_at``)."""
    at = lost_at.get(seg.gpu_id)
    return at is not None and seg.start >= at


# (job id or None, gpu id, USD per GPU-hour, after the GPU was lost)
LineKey = tuple[str | None, int, float | None, bool]


class Span(NamedTuple):
    """A stretch of one GPU whose usage, times ``factor``, group ``group`` sums."""

    group: int
    gpu_id: int
    start: datetime
    end: datetime
    factor: float


def group_segments(
    segments: Sequence[Segment],
    price_of: Callable[[Segment], float | None],
    lost_at: Mapping[int, datetime] | None = None,
) -> tuple[list[LineKey], list[float], list[Span]]:
    """Shares of segments keyed by (job, GPU, price, lost): the keys, their held seconds, and
    the spans (group = key index, factor = share) whose usage each key sums.

    The same split as ``lines_from_segments``, but a job's many segments on one GPU at one
    price become one line, so the database can sum them in one pass.
    """
    lost_at = lost_at or {}
    index: dict[LineKey, int] = {}
    held: list[float] = []
    spans: list[Span] = []
    for seg in segments:
        price = price_of(seg)
        seconds = (seg.end - seg.start).total_seconds()
        owners: tuple[str | None, ...] = seg.job_ids or (None,)
        share = 1.0 / len(owners)
        lost = _is_lost(seg, lost_at)
        for job_id in owners:
            key = (job_id, seg.gpu_id, price, lost)
            group = index.get(key)
            if group is None:
                group = index[key] = len(held)
                held.append(0.0)
            held[group] += seconds * share
            spans.append(Span(group, seg.gpu_id, seg.start, seg.end, share))
    return list(index), held, spans


def summarize(
    lines: Iterable[Line], key_of: Callable[[Line], str], *, jobs_only: bool = True
) -> dict[str, Summary]:
    """Group lines by ``key_of`` into summaries; with ``jobs_only`` (grouping by something of a
    job) lines of no job go to ``__unallocated__``, else ``key_of`` keys them too."""
    out: dict[str, Summary] = {}
    for line in lines:
        key = UNALLOCATED if jobs_only and line.job_id is None else key_of(line)
        s = out.get(key)
        if s is None:
            s = out[key] = Summary(key)
        s.add_line(line)
    return out


# What a cost report can group its lines by; the API, the CLI and the report all read this.
# Beside these, ``label:<key>`` groups by any job label (service.costs.job_groups).
GroupBy = Literal["job", "user", "team", "project", "namespace", "node", "gpu_model", "gpu"]
GROUP_BYS: tuple[str, ...] = get_args(GroupBy)
# Groups of hardware hold every second of their GPUs, a job's or not: no __unallocated__ row.
HARDWARE_GROUP_BYS: tuple[str, ...] = ("node", "gpu_model", "gpu")
