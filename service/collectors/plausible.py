"""Which metric values are impossible readings rather than measurements (pure).

A value that is not finite, outside its metric's range in the vocabulary (``METRIC_BOUNDS``: what
hardware can report, the bounds central's ingest refuses past), or one of DCGM's "blank"
sentinels is a glitch of the source. The agent drops such
a field from its one sample and ships the rest, so one bad value never costs a batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.collectors.backend import GpuReading, ProcessReading
from service.vocabulary import FB_MAX_BYTES, METRIC_BOUNDS, METRICS_BY_NAME

_PID_LIMIT = 2**31  # central keeps PIDs in 32-bit columns; Linux's pid_max is at most 2^22

# DCGM's blank / not-found / not-supported / no-permission markers (dcgm_fields.h) for 32- and
# 64-bit integers and doubles, and the all-ones 32-bit value seen as GPU_UTIL (NVIDIA/DCGM#199).
DCGM_SENTINELS: frozenset[float] = frozenset(
    [float(0x7FFFFFF0 + k) for k in range(4)]
    + [float(0x7FFFFFFFFFFFFFF0 + k) for k in range(4)]
    + [140737488355328.0 + k for k in range(4)]
    + [4294967295.0]
)


# (lowest, highest) accepted per metric: NaN fails both comparisons, infinities one of them.
_BOUNDS: dict[str, tuple[float, float]] = {name: METRIC_BOUNDS[name] for name in METRICS_BY_NAME}


def implausible(name: str, value: float) -> str | None:
    """Why ``value`` cannot be a reading of metric ``name``, or None when it can."""
    spec = METRICS_BY_NAME.get(name)
    if spec is None:
        return "unknown metric"
    if not math.isfinite(value):
        return "not finite"
    if value in DCGM_SENTINELS:
        return "DCGM sentinel"
    low, high = _BOUNDS[name]
    if not low <= value <= high:
        return "out of range"
    return None


@dataclass(frozen=True, slots=True)
class Dropped:
    """One field taken out of one GPU's sample, and why."""

    gpu_uuid: str
    field: str
    value: float
    reason: str


def drop_implausible(readings: list[GpuReading]) -> list[Dropped]:
    """Remove implausible fields from ``readings`` in place; returns what was removed."""
    out: list[Dropped] = []
    bounds, sentinels = _BOUNDS, DCGM_SENTINELS
    for r in readings:
        bad = [
            Dropped(r.uuid, k, v, implausible(k, v) or "unknown metric")
            for k, v in r.metrics.items()
            if (b := bounds.get(k)) is None or not b[0] <= v <= b[1] or v in sentinels
        ]
        for d in bad:
            del r.metrics[d.field]
        out.extend(bad)
    return out


def drop_implausible_processes(processes: list[ProcessReading]) -> list[Dropped]:
    """Remove impossible process readings in place: a PID outside 0..2^31-1 drops the process,
    a memory figure outside 0..FB_MAX_BYTES just that figure; returns what was removed."""
    out: list[Dropped] = []
    keep: list[ProcessReading] = []
    for p in processes:
        if not 0 <= p.pid < _PID_LIMIT:
            out.append(Dropped(p.gpu_uuid, "process.pid", float(p.pid), "out of range"))
            continue
        used = p.fb_used_bytes
        if used is not None and not 0 <= used <= FB_MAX_BYTES:
            out.append(Dropped(p.gpu_uuid, "process.fb_used_bytes", float(used), "out of range"))
            p.fb_used_bytes = None
        keep.append(p)
    if out:
        processes[:] = keep
    return out
