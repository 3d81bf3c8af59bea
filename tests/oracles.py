"""Reference computations the tests hold the service's faster paths to: each is the plain,
one-step-at-a-time form of what the service does in bulk."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from service.core.diagnosis import Thresholds, decide, duty_of
from service.costs.integrals import ActivityPoint, busier_pcie
from service.costs.waste import Line, Segment, Usage, _is_lost


def point_of(
    ts: float,
    values: Mapping[str, float | None],
    thresholds: Thresholds,
    *,
    has_process: bool = False,
) -> ActivityPoint:
    """The point of a sample given by its metric values, deciding activity and cause now."""
    d = decide(values, thresholds, has_process=has_process)
    power = values.get("power_watts")
    if d is None:
        return ActivityPoint(ts, None, None, None, power)
    return ActivityPoint(
        ts, d.activity, int(d.rung), int(d.cause), power, duty_of(values, d.rung),
        values.get("dram_active"), busier_pcie(values),
    )  # fmt: skip


def lines_from_segments(
    segments: Sequence[Segment],
    usages: Sequence[Usage],
    price_of: Callable[[Segment], float | None],
    lost_at: Mapping[int, datetime] | None = None,
) -> list[Line]:
    """Attribute each segment's usage: 1/k to each of its k jobs, or all of it to no job."""
    lost_at = lost_at or {}
    out: list[Line] = []
    for seg, usage in zip(segments, usages, strict=True):
        price = price_of(seg)
        seconds = (seg.end - seg.start).total_seconds()
        lost = _is_lost(seg, lost_at)
        if not seg.job_ids:
            out.append(Line(None, seg.gpu_id, seconds, usage, price, lost))
            continue
        share = 1.0 / len(seg.job_ids)
        for job_id in seg.job_ids:
            out.append(Line(job_id, seg.gpu_id, seconds * share, usage.scaled(share), price, lost))
    return out


def split_cents(total_cents: int, weights: Mapping[str, float]) -> dict[str, int]:
    """``total_cents`` split by ``weights`` into whole cents that add up exactly (largest
    remainder; ties by key)."""
    total_w = sum(max(w, 0.0) for w in weights.values())
    if not weights:
        return {}
    if total_w <= 0:
        weights = {k: 1.0 for k in weights}
        total_w = float(len(weights))
    exact = {k: total_cents * max(w, 0.0) / total_w for k, w in weights.items()}
    out = {k: int(v // 1) for k, v in exact.items()}
    left = total_cents - sum(out.values())
    for k in sorted(exact, key=lambda k: (-(exact[k] - out[k]), k))[: max(left, 0)]:
        out[k] += 1
    return out
