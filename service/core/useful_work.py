"""Useful work (issue 47): whether a busy GPU's activity does any, decided over a window.

Pure: a window of one GPU's samples (its GPM and NVML figures), the job's host side as the agent
read it from /proc (running totals over the job's processes and their children) and its
progress readings in; a verdict with its evidence out. One sample never decides: a keep-alive
loop's seconds look like ``compute_no_tensor`` or ``input_starved``, a hung collective's like
``launch_bound``; only their pattern held for ``hold_seconds`` with nothing read, nothing written
and no progress tells. Where the GPM figures or the host side are missing the verdict is
``unverified`` and no ladder step follows (docs/diagnosis.md, *Useful work*).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import pairwise

from service.core.diagnosis import Cause

# A job carrying this label (any value: benchmark, burn-in) is never sham or hung.
EXEMPT_LABEL = "gpuwarden.io/exempt-useful-work"
MIB = 1024**2


class Kind(StrEnum):
    """What a window of a GPU's time was, as far as useful work goes."""

    SHAM = "sham"  # busy with a steady pattern, nothing read or written, no progress
    HUNG = "hung"  # a kernel resident all the time while the job stopped advancing
    USEFUL = "useful"  # progress advanced, or data moved: real work
    IDLE = "idle"  # too little ran to be either: the idle causes already cover it
    UNVERIFIED = "unverified"  # the GPU pattern fits, but GPM or the host side is missing
    EXEMPT = "exempt"  # the job is labelled gpuwarden.io/exempt-useful-work


CAUSE_OF_KIND: dict[Kind, Cause] = {Kind.SHAM: Cause.SHAM, Kind.HUNG: Cause.HUNG}


@dataclass(frozen=True, slots=True)
class GpuPoint:
    """One sample of the GPU: its time (Unix seconds) and its canonical metric values."""

    ts: float
    values: Mapping[str, float | None]


@dataclass(frozen=True, slots=True)
class HostPoint:
    """One process of the job (``pid``) at ``ts`` (Unix seconds): its running totals summed
    with its descendants': CPU seconds, bytes read and written (every read and write call,
    sockets included: /proc/<pid>/io rchar and wchar) and its main thread's voluntary context
    switches."""

    ts: float
    cpu_seconds: float
    read_bytes: float
    write_bytes: float
    voluntary_switches: float
    children: int = 0
    pid: int = 0


@dataclass(frozen=True, slots=True)
class Rules:
    """The thresholds of the verdict (ratios unless the name has a unit)."""

    hold_seconds: float = 600.0  # the evidence must hold this long (setting, minutes)
    idle: float = 0.05  # a sample with a duty cycle under this ran nothing
    busy_share: float = 0.1  # at least this share of the samples ran something
    gpm_share: float = 0.9  # at least this share of the samples carries SM activity (GPM)
    io_bytes_per_minute: float = 256 * 1024  # reads + writes under this: nothing was read
    fb_flat_bytes: float = 64 * MIB  # memory in use moved less than this: no churn
    # PCIe traffic (median, both ways) above this moved data; kernel launches alone move tens
    # of MB/s (docs/gpu-check: 14 MB/s beside bf16 matmuls), a batch per step hundreds.
    pcie_bytes_per_second: float = 100e6
    resident_duty: float = 0.95  # a kernel is resident in a sample with this duty cycle ...
    resident_share: float = 0.95  # ... in this share of the samples
    resident_fill: float = 0.25  # ... filling under this share of the SMs (a spin, a wait)
    host_cycling_per_second: float = 1.0  # main-thread voluntary switches: the loop sleeps
    odd_duty: float = 0.3  # a GPU whose mean duty is this far from its peers' is named


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the window showed, in figures the notice turns into words."""

    seconds: float
    samples: int
    busy_share: float
    mean_duty: float
    duty_spread: float  # standard deviation of the duty cycle over the busy samples
    mean_sm_active: float | None
    fb_range_bytes: float | None
    fb_used_bytes: float | None
    pcie_bytes_per_second: float | None  # median over the busy samples
    io_bytes: float | None
    cpu_share: float | None
    switches_per_second: float | None
    burst_period_seconds: float | None
    burst_seconds: float | None
    progress_advanced: bool | None  # None: the job reports no progress


@dataclass(frozen=True, slots=True)
class Verdict:
    """A window's kind, its evidence and, where it is sham or hung, the plain words of why."""

    kind: Kind
    evidence: Evidence | None
    words: str

    @property
    def cause(self) -> Cause | None:
        """The cause the window's seconds take (sham or hung), None for every other kind."""
        return CAUSE_OF_KIND.get(self.kind)


def duty(values: Mapping[str, float | None]) -> float | None:
    """The share of time a kernel ran: the graphics engine's (GPM), else NVML's duty cycle."""
    for name in ("gr_engine_active", "gpu_util"):
        v = values.get(name)
        if v is not None:
            return float(v)
    return None


def _pcie(values: Mapping[str, float | None]) -> float | None:
    parts = [values.get(n) for n in ("pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second")]
    known = [float(v) for v in parts if v is not None]
    return sum(known) if known else None


def _bursts(ts: Sequence[float], busy: Sequence[bool]) -> tuple[float | None, float | None]:
    """The median period between the starts of busy runs and their median length (seconds),
    where there are at least three runs with idle samples between."""
    starts: list[float] = []
    lengths: list[float] = []
    run_start: float | None = None
    for i, b in enumerate(busy):
        if b and run_start is None:
            run_start = ts[i]
            starts.append(ts[i])
        if not b and run_start is not None:
            lengths.append(ts[i] - run_start)
            run_start = None
    if len(starts) < 3 or not lengths:
        return None, None
    periods = [b - a for a, b in pairwise(starts)]
    return statistics.median(periods), statistics.median(lengths)


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def evidence_of(
    gpu: Sequence[GpuPoint],
    host: Sequence[HostPoint],
    progress: Sequence[tuple[float, float]],
    idle: float = 0.05,
) -> Evidence:
    """The figures of a window: ``gpu`` samples and ``host`` readings in time order,
    ``progress`` readings (Unix seconds, running total) in it; empty progress: none reported."""
    ts = [p.ts for p in gpu]
    duties = [d if (d := duty(p.values)) is not None else 0.0 for p in gpu]
    busy = [d >= idle for d in duties]
    busy_duties = [d for d, b in zip(duties, busy, strict=True) if b]
    sm = [float(v) for p in gpu if (v := p.values.get("sm_active")) is not None]
    fb = [float(v) for p in gpu if (v := p.values.get("fb_used_bytes")) is not None]
    # Traffic while kernels ran: a notebook's idle minutes do not hide its cell's copies.
    pcie = [v for p, b in zip(gpu, busy, strict=True) if b and (v := _pcie(p.values)) is not None]
    seconds = ts[-1] - ts[0] if len(ts) > 1 else 0.0
    io = cpu = switches = None
    by_pid: dict[int, list[HostPoint]] = {}
    for h in host:
        by_pid.setdefault(h.pid, []).append(h)
    span = max((hs[-1].ts - hs[0].ts for hs in by_pid.values()), default=0.0)
    if span >= 0.5 * seconds and span > 0:
        io = cpu = switches = 0.0
        for hs in by_pid.values():
            first, last = hs[0], hs[-1]
            io += max(0.0, last.read_bytes - first.read_bytes)
            io += max(0.0, last.write_bytes - first.write_bytes)
            cpu += max(0.0, last.cpu_seconds - first.cpu_seconds) / span
            switches += max(0.0, last.voluntary_switches - first.voluntary_switches) / span
    period, burst = _bursts(ts, busy)
    advanced = None if not progress else progress[-1][1] > progress[0][1]
    return Evidence(
        seconds=seconds,
        samples=len(gpu),
        busy_share=sum(busy) / len(gpu) if gpu else 0.0,
        mean_duty=statistics.fmean(duties) if duties else 0.0,
        duty_spread=statistics.pstdev(busy_duties) if len(busy_duties) > 1 else 0.0,
        mean_sm_active=statistics.fmean(sm) if sm else None,
        fb_range_bytes=max(fb) - min(fb) if fb else None,
        fb_used_bytes=_median(fb),
        pcie_bytes_per_second=_median(pcie),
        io_bytes=io,
        cpu_share=cpu,
        switches_per_second=switches,
        burst_period_seconds=period,
        burst_seconds=burst,
        progress_advanced=advanced,
    )


def judge(
    gpu: Sequence[GpuPoint],
    host: Sequence[HostPoint],
    progress: Sequence[tuple[float, float]] = (),
    *,
    rules: Rules = Rules(),
    labels: Mapping[str, str] | None = None,
) -> Verdict:
    """The verdict on a window of one GPU that ends at its last sample: only the samples,
    host readings and progress of the last ``rules.hold_seconds`` count, and the window must
    span that long (``labels``: the job's, for the exemption)."""
    if labels and EXEMPT_LABEL in labels:
        return Verdict(Kind.EXEMPT, None, f"exempt: labelled {EXEMPT_LABEL}={labels[EXEMPT_LABEL]}")
    if not gpu:
        return Verdict(Kind.UNVERIFIED, None, "no samples")
    lo = gpu[-1].ts - rules.hold_seconds
    gpu = [p for p in gpu if p.ts >= lo]
    host = [h for h in host if h.ts >= lo]
    progress = [r for r in progress if r[0] >= lo]
    ev = evidence_of(gpu, host, progress, rules.idle)
    if ev.progress_advanced:
        return Verdict(Kind.USEFUL, ev, "progress advanced")
    if ev.busy_share < rules.busy_share:
        return Verdict(Kind.IDLE, ev, "too little ran: the idle causes cover it")
    if ev.seconds < 0.8 * rules.hold_seconds:
        return Verdict(Kind.UNVERIFIED, ev, "the window is shorter than the hold time")
    minutes = ev.seconds / 60.0
    if ev.io_bytes is not None and ev.io_bytes > rules.io_bytes_per_minute * minutes:
        return Verdict(Kind.USEFUL, ev, "the job read or wrote data")
    if ev.fb_range_bytes is not None and ev.fb_range_bytes > rules.fb_flat_bytes:
        return Verdict(Kind.USEFUL, ev, "the job's memory use changed")
    pcie = ev.pcie_bytes_per_second
    if pcie is not None and pcie > rules.pcie_bytes_per_second:
        return Verdict(Kind.USEFUL, ev, "data moved over PCIe")
    gpm = sum(1 for p in gpu if p.values.get("sm_active") is not None) / len(gpu)
    resident = _resident(gpu, rules)
    stopped = ev.progress_advanced is False
    if gpm < rules.gpm_share or ev.io_bytes is None:
        missing = "no GPM counters" if gpm < rules.gpm_share else "no /proc readings"
        return Verdict(Kind.UNVERIFIED, ev, f"the pattern fits, but {missing}: no step taken")
    cycling = (ev.switches_per_second or 0.0) >= rules.host_cycling_per_second
    if resident and (stopped or not cycling):
        return Verdict(Kind.HUNG, ev, words(Kind.HUNG, ev))
    if stopped and ev.busy_share >= 0.5:
        return Verdict(Kind.HUNG, ev, words(Kind.HUNG, ev))
    return Verdict(Kind.SHAM, ev, words(Kind.SHAM, ev))


@dataclass(frozen=True, slots=True)
class Hold:
    """A job's hold on a GPU (Unix seconds): ``end`` None while open; an ``observed`` one (no
    scheduler registered it) still open holds only while its processes are seen, ``last_seen``
    being the latest time they were (None: not in the window read)."""

    job_id: str
    start: float
    end: float | None
    observed: bool = False
    last_seen: float | None = None


def _holds_until(h: Hold, start: float) -> float:
    """Until when ``h`` holds its GPU, seen from a window starting at ``start``: its end; an
    open observed hold seen since ``start`` is open, one not seen since ended when last seen."""
    if h.end is not None:
        return h.end
    if h.observed and (h.last_seen is None or h.last_seen < start):
        return h.last_seen if h.last_seen is not None else float("-inf")
    return float("inf")


def sole_holder(holds: Sequence[Hold], start: float, end: float) -> str | None:
    """The job that alone held the GPU through [start, end], None where none did or another
    job held it for part of that time (a GPU changing hands, or shared). An observed hold left
    open whose processes were last seen before ``start`` has ended (it is closed at that time
    once the grace period passes): it neither holds nor shares the window."""
    inside = [h for h in holds if h.start <= end and _holds_until(h, start) >= start]
    if len({h.job_id for h in inside}) != 1:
        return None
    if not any(h.start <= start and _holds_until(h, start) >= end for h in inside):
        return None
    return inside[0].job_id


def _resident(gpu: Sequence[GpuPoint], rules: Rules) -> bool:
    """A kernel sat on the GPU nearly all the time, filling few SMs (a spin or a wait)."""
    hits = 0
    for p in gpu:
        d, sm = duty(p.values), p.values.get("sm_active")
        if d is not None and sm is not None and d >= rules.resident_duty:
            hits += sm < rules.resident_fill * d
    return hits >= rules.resident_share * len(gpu)


def _span(seconds: float) -> str:
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} hours"
    if seconds >= 90:
        return f"{seconds / 60:.0f} minutes"
    return f"{seconds:.0f} s"


def words(kind: Kind, ev: Evidence) -> str:
    """The evidence in plain words, as the notice says it."""
    span = _span(ev.seconds)
    if kind is Kind.HUNG:
        sm = f" on {ev.mean_sm_active:.1%} of its SMs" if ev.mean_sm_active is not None else ""
        head = f"a kernel has stayed resident{sm} for {span} while nothing advanced"
    elif ev.burst_period_seconds is not None and ev.busy_share < 0.8:
        head = (
            f"the GPU has run the same {ev.burst_seconds or 0:.0f} s burst every "
            f"{ev.burst_period_seconds:.0f} s for {span}"
        )
    else:
        head = (
            f"the GPU has been held at a flat {ev.mean_duty:.0%} duty cycle "
            f"(spread {ev.duty_spread:.0%}) for {span}"
        )
    parts = [head]
    if ev.io_bytes is not None:
        parts.append(f"no data was read or written ({ev.io_bytes / 1024:.0f} KiB)")
    if ev.fb_used_bytes is not None:
        parts.append(f"memory held flat at {ev.fb_used_bytes / 1024**3:.1f} GiB")
    parts.append("progress stopped" if ev.progress_advanced is False else "no progress reported")
    return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class OddGpu:
    """A GPU of a multi-GPU job whose pattern departs from its peers' (a straggler or a dead
    rank): its mean duty cycle and the peers' median."""

    gpu_uuid: str
    mean_duty: float
    peers_duty: float


def odd_gpus(windows: Mapping[str, Sequence[GpuPoint]], rules: Rules = Rules()) -> list[OddGpu]:
    """The GPUs of one job (three or more) whose mean duty cycle over the window is at least
    ``rules.odd_duty`` from the median of the others'."""
    means = {
        uuid: statistics.fmean([duty(p.values) or 0.0 for p in pts])
        for uuid, pts in windows.items()
        if pts
    }
    if len(means) < 3:
        return []
    out = []
    for uuid, mean in sorted(means.items()):
        peers = statistics.median([m for u, m in means.items() if u != uuid])
        if abs(mean - peers) >= rules.odd_duty:
            out.append(OddGpu(uuid, mean, peers))
    return out


def sliding(
    gpu: Sequence[GpuPoint],
    host: Sequence[HostPoint],
    progress: Sequence[tuple[float, float]] = (),
    *,
    rules: Rules = Rules(),
    labels: Mapping[str, str] | None = None,
) -> list[Verdict]:
    """The verdict at each sample of ``gpu`` (time order) on the window that ends there: what
    the second that sample covers becomes."""
    out = []
    lo_gpu = lo_host = lo_prog = 0
    for i, p in enumerate(gpu):
        lo = p.ts - rules.hold_seconds
        while gpu[lo_gpu].ts < lo:
            lo_gpu += 1
        while lo_host < len(host) and host[lo_host].ts < lo:
            lo_host += 1
        while lo_prog < len(progress) and progress[lo_prog][0] < lo:
            lo_prog += 1
        hi_host = lo_host
        while hi_host < len(host) and host[hi_host].ts <= p.ts:
            hi_host += 1
        hi_prog = lo_prog
        while hi_prog < len(progress) and progress[hi_prog][0] <= p.ts:
            hi_prog += 1
        out.append(
            judge(
                gpu[lo_gpu : i + 1],
                host[lo_host:hi_host],
                progress[lo_prog:hi_prog],
                rules=rules,
                labels=labels,
            )
        )
    return out
