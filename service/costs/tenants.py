"""Tenants of a shared GPU: each job's share of the GPU's time, activity, causes and cost.

Pure: takes one GPU's samples (with the stored decision), the processes listed at each sample
(with the job they belong to, memory held and NVML's per-process SM utilisation) and which jobs
held the GPU when, and returns each job's integrals. The shares of every sample add up to the
sample's time, and the tenants' activity to the GPU's activity, so tenants' costs add up to the
GPU's cost whatever the rule.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from itertools import pairwise

from service.core.diagnosis import CAUSES, IDLE_CAUSES, Cause, Rung
from service.costs.integrals import (
    CAUSE_ENERGY_FIELDS,
    CAUSE_FIELDS,
    INTEGRAL_FIELDS,
    ActivityPoint,
    Integrals,
    Thresholds,
    add_signal,
    idle_seconds_of,
)
from service.costs.waste import Line, Segment, Usage

UNALLOCATED_TENANT = ""  # the key of GPU time no job held, in a shared minute


class SplitRule(StrEnum):
    """How a shared GPU's time (and so its cost) is split between the jobs holding it."""

    EQUAL = "equal"  # 1/k of every second to each of the k jobs (the behaviour before tenants)
    MEMORY = "memory"  # by the GPU memory each job's processes hold
    ACTIVITY = "activity"  # busy time by each job's SM share, idle time by memory held


SPLIT_RULES: tuple[str, ...] = tuple(r.value for r in SplitRule)


@dataclass(frozen=True, slots=True)
class TenantProcess:
    """A row listed at one sample: its job, memory held (bytes), SM utilisation (ratio, None
    where none was given) and whether it is a process (False: a holder row, a job holding the
    GPU with no process of it listed, which may carry the job's own SM figure)."""

    job_id: str | None
    fb_used_bytes: float | None = None
    sm_util: float | None = None
    is_process: bool = True


@dataclass(frozen=True, slots=True)
class TenantState:
    """What one job shows at one sample: memory its processes hold (bytes), their SM
    utilisation summed (None if unknown), and whether it has a process at all (None: unknown,
    a process nobody could attribute may be its)."""

    fb_used_bytes: float = 0.0
    sm_util: float | None = None
    has_process: bool | None = False


def tenant_states(
    holders: Sequence[str], procs: Sequence[TenantProcess], *, unseen: bool = False
) -> dict[str, TenantState]:
    """Each holder's state at one sample from the rows listed then (other jobs' are ignored).

    A process without a job (several pods share the GPU and the agent cannot tell whose it
    is) may be any holder's: its memory and SM utilisation go to the holders in equal parts,
    and a holder with no process of its own is not known to have none. ``unseen`` (something
    runs that no listed process shows, as on a backend that lists none) makes it unknown too.
    """
    out: dict[str, TenantState] = {}
    if not holders:
        return out
    nobodys = [p for p in procs if p.job_id is None and p.is_process]
    part_fb, part_sm = _nobodys_parts(nobodys, len(holders))
    unknown = bool(nobodys) or unseen
    for job in holders:
        out[job] = _holder_state([p for p in procs if p.job_id == job], part_fb, part_sm, unknown)
    return out


def _nobodys_parts(nobodys: Sequence[TenantProcess], n_holders: int) -> tuple[float, float | None]:
    """Each holder's equal part of the memory (bytes) and SM utilisation (None if none was
    given) of the processes without a job."""
    part_fb = sum(p.fb_used_bytes or 0.0 for p in nobodys) / n_holders
    nobodys_sm = [p.sm_util for p in nobodys if p.sm_util is not None]
    part_sm = sum(nobodys_sm) / n_holders if nobodys_sm else None
    return part_fb, part_sm


def _holder_state(
    mine: Sequence[TenantProcess], part_fb: float, part_sm: float | None, unknown: bool
) -> TenantState:
    """One holder's state from its own rows ``mine`` plus its part of the processes without a
    job; ``unknown``: without a process of its own it is not known to have none."""
    utils = [p.sm_util for p in mine if p.sm_util is not None]
    if part_sm is not None:
        utils.append(part_sm)
    own = any(p.is_process for p in mine)
    return TenantState(
        fb_used_bytes=float(sum(p.fb_used_bytes or 0.0 for p in mine)) + part_fb,
        sm_util=float(sum(utils)) if utils else None,
        has_process=True if own else (None if unknown else False),
    )


def _normalised(values: Mapping[str, float]) -> dict[str, float] | None:
    total = sum(values.values())
    if total <= 0:
        return None
    return {k: v / total for k, v in values.items()}


def busy_shares(states: Mapping[str, TenantState]) -> dict[str, float] | None:
    """Each tenant's share of the GPU's busy time from its own processes' SM utilisation (adds
    up to 1), or None when per-process figures do not tell (none reported, or all zero)."""
    known = {k: s.sm_util for k, s in states.items() if s.sm_util is not None}
    if not known:
        return None
    # A tenant whose processes NVML left out of the samples ran no kernels: 0.
    return _normalised({k: known.get(k, 0.0) for k in states})


def time_shares(
    rule: SplitRule, states: Mapping[str, TenantState], *, busy: bool
) -> dict[str, float]:
    """Each tenant's share of one sample's time under ``rule`` (adds up to 1).

    ``memory`` falls back to equal when no tenant holds memory; ``activity`` splits busy time
    by busy share and idle time (or busy time per-process figures do not tell) by memory.
    """
    equal = {k: 1.0 / len(states) for k in states} if states else {}
    by_memory = _normalised({k: s.fb_used_bytes for k, s in states.items()}) or equal
    if rule is SplitRule.EQUAL:
        return equal
    if rule is SplitRule.MEMORY:
        return by_memory
    shares = busy_shares(states) if busy else None
    return shares if shares is not None else by_memory


def tenant_cause(gpu_cause: Cause, state: TenantState, busy_share: float | None) -> Cause:
    """A tenant's cause at one sample: the GPU's busy cause if the tenant ran kernels (or
    per-process figures do not tell), else ``idle_held`` with a process, ``idle_empty``
    without one; a tenant not known to have none (``has_process`` None) is never called
    empty while the GPU holds something."""
    if gpu_cause in IDLE_CAUSES:
        if state.has_process is None:
            return gpu_cause
        return Cause.IDLE_HELD if state.has_process else Cause.IDLE_EMPTY
    if busy_share is not None and busy_share <= 0.0:
        return Cause.IDLE_EMPTY if state.has_process is False else Cause.IDLE_HELD
    if busy_share is None and state.has_process is False:
        return Cause.IDLE_EMPTY  # nothing of this job is on the GPU: allocated but empty
    return gpu_cause


_CAUSE_FIELD: dict[int, str] = {int(c): CAUSE_FIELDS[c.column] for c in CAUSES}
_CAUSE_ENERGY: dict[int, str] = {int(c): CAUSE_ENERGY_FIELDS[c.column] for c in CAUSES}


@dataclass(slots=True)
class TenantShare:
    """One tenant's part of a stretch: its integrals and the wall seconds it held (its share
    of the covered time plus an equal share of the time no sample covers)."""

    integrals: Integrals
    held_seconds: float = 0.0


def _holders(holding: Mapping[str, Sequence[tuple[float, float]]], t: float) -> list[str]:
    return sorted(j for j, spans in holding.items() if any(s <= t < e for s, e in spans))


def _ts_of(point: ActivityPoint) -> float:
    return point.ts


def split_stretch(
    points: Sequence[ActivityPoint],
    procs: Mapping[float, Sequence[TenantProcess]],
    holding: Mapping[str, Sequence[tuple[float, float]]],
    start: float,
    end: float,
    thresholds: Thresholds,
    rule: SplitRule,
) -> dict[str, TenantShare]:
    """Each job's integrals over [start, end) of one GPU (Unix seconds), and the unallocated
    remainder under ``UNALLOCATED_TENANT``.

    ``points`` are sorted and include one before ``start``; ``procs`` maps a sample's ts to the
    processes listed then; ``holding`` maps each job to the [s, e) spans it held the GPU. A
    sample's time goes to the jobs holding the GPU at its middle, split by ``rule``.
    """
    out: dict[str, TenantShare] = {}

    def share(key: str) -> TenantShare:
        s = out.get(key)
        if s is None:
            s = out[key] = TenantShare(Integrals())
        return s

    covered: list[tuple[float, float]] = []
    n = len(points)
    # Only the last sample before start and those before end can cover a second of the
    # stretch: a caller passes a GPU's whole series for each of its minutes.
    first = max(bisect_left(points, start, key=_ts_of) - 1, 0)
    for i in range(first, bisect_left(points, end, lo=first, key=_ts_of)):
        p = points[i]
        cover_end = p.ts + thresholds.max_gap_seconds
        if i + 1 < n and points[i + 1].ts < cover_end:
            cover_end = points[i + 1].ts
        lo, hi = max(p.ts, start), min(cover_end, end)
        if hi <= lo or p.activity is None or p.cause is None:
            continue
        covered.append((lo, hi))
        for lo2, hi2, holders in _pieces(holding, lo, hi):
            _add_sample(share, p, procs.get(p.ts, ()), holders, hi2 - lo2, rule)
    # Time no sample covers: nodata, held equally by whoever held the GPU then.
    t = start
    for lo, hi in [*covered, (end, end)]:
        if t < lo:
            for lo2, hi2, holders in _pieces(holding, t, lo):
                keys = holders or [UNALLOCATED_TENANT]
                for k in keys:
                    share(k).held_seconds += (hi2 - lo2) / len(keys)
        t = max(t, hi)
    for s in out.values():
        s.integrals.idle_seconds = idle_seconds_of(s.integrals)
    return out


def _pieces(
    holding: Mapping[str, Sequence[tuple[float, float]]], lo: float, hi: float
) -> list[tuple[float, float, list[str]]]:
    """[lo, hi) cut where the set of holders changes, with the holders of each piece."""
    inside = {x for spans in holding.values() for span in spans for x in span if lo < x < hi}
    cuts = sorted({lo, hi} | inside)
    return [(a, b, _holders(holding, (a + b) / 2)) for a, b in pairwise(cuts)]


def _add_sample(
    share: Callable[[str], TenantShare],
    p: ActivityPoint,
    listed: Sequence[TenantProcess],
    holders: list[str],
    dt: float,
    rule: SplitRule,
) -> None:
    assert p.activity is not None and p.cause is not None
    activity = p.activity
    gpu_cause = Cause(p.cause)
    busy = gpu_cause not in IDLE_CAUSES
    if not holders:
        states: dict[str, TenantState] = {UNALLOCATED_TENANT: TenantState(has_process=True)}
        weights = {UNALLOCATED_TENANT: 1.0}
        bshares: dict[str, float] | None = None
        causes = {UNALLOCATED_TENANT: gpu_cause}
    else:
        # The GPU holds or runs something no listed process shows (a backend that lists no
        # processes, dcgm-exporter): no tenant can be called empty.
        unseen = gpu_cause is not Cause.IDLE_EMPTY and not any(q.is_process for q in listed)
        states = tenant_states(holders, listed, unseen=unseen)
        weights = time_shares(rule, states, busy=busy)
        bshares = busy_shares(states) if busy else None
        causes = {
            k: tenant_cause(gpu_cause, states[k], None if bshares is None else bshares[k])
            for k in states
        }
    for key, w in weights.items():
        s = share(key)
        seconds = dt * w
        # The tenant's own activity where per-process figures tell (the activity rule), else
        # its time share of the GPU's: either way the tenants' activity adds up to the GPU's.
        own = bshares[key] if (bshares is not None and rule is SplitRule.ACTIVITY) else w
        integ = s.integrals
        s.held_seconds += seconds
        integ.covered_seconds += seconds
        integ.unused_seconds += seconds - dt * activity * own
        if p.rung == int(Rung.GPU_UTIL):
            integ.fallback_seconds += seconds
        code = int(causes[key])
        f = _CAUSE_FIELD[code]
        setattr(integ, f, getattr(integ, f) + seconds)
        if code == p.cause:  # the GPU's own cause: its signals describe the tenant's seconds
            add_signal(integ, p, code, seconds)
        if p.power_watts is not None:
            joules = seconds * p.power_watts
            integ.energy_used_joules += joules
            e = _CAUSE_ENERGY[code]
            setattr(integ, e, getattr(integ, e) + joules)


def without_stretches(
    segments: Sequence[Segment], stretches: Sequence[tuple[datetime, datetime]]
) -> list[Segment]:
    """``segments`` of one GPU, in time order, with the sorted, disjoint ``stretches`` [a, b)
    cut out (the shared minutes a report reads from tenant rows instead)."""
    if not stretches:
        return list(segments)
    out: list[Segment] = []
    i, n = 0, len(stretches)
    for seg in segments:
        while i < n and stretches[i][1] <= seg.start:
            i += 1
        t = seg.start
        j = i
        while j < n and stretches[j][0] < seg.end:
            a, b = stretches[j]
            if t < a:
                out.append(Segment(seg.gpu_id, t, a, seg.job_ids))
            t = max(t, b)
            j += 1
        if t < seg.end:
            out.append(Segment(seg.gpu_id, t, seg.end, seg.job_ids))
    return out


def tenant_line(row: Mapping[str, object], fraction: float) -> Line:
    """A report line from one stored tenant row, ``fraction`` of it inside the report (the
    price is set by the caller)."""
    usage = Usage()
    for f in INTEGRAL_FIELDS:
        setattr(usage, f, fraction * float(row[f]))  # type: ignore[arg-type]
    tenant = str(row["tenant"])
    held = fraction * float(row["held_seconds"])  # type: ignore[arg-type]
    return Line(tenant or None, int(row["gpu_id"]), held, usage, None)  # type: ignore[call-overload]
