"""Cutting shared stretches out of a GPU's segments: the same segments as cutting out each
shared minute one by one."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from service.costs.tenants import without_stretches
from service.costs.waste import Allocation, Segment, segment_gpu

T0 = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def _minute_by_minute(segments: list[Segment], minutes: list[datetime]) -> list[Segment]:
    """Each whole minute cut out of the segments in turn (what reports did before stretches)."""
    out: list[Segment] = []
    for seg in segments:
        t = seg.start
        for m in minutes:
            if m + MINUTE <= t or m >= seg.end:
                continue
            if t < m:
                out.append(Segment(seg.gpu_id, t, m, seg.job_ids))
            t = max(t, m + MINUTE)
        if t < seg.end:
            out.append(Segment(seg.gpu_id, t, seg.end, seg.job_ids))
    return out


def _stretches(minutes: list[datetime]) -> list[tuple[datetime, datetime]]:
    out: list[tuple[datetime, datetime]] = []
    for m in minutes:
        if out and out[-1][1] == m:
            out[-1] = (out[-1][0], m + MINUTE)
        else:
            out.append((m, m + MINUTE))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_stretches_cut_what_their_minutes_cut(seed: int) -> None:
    rng = random.Random(seed)
    span = 600  # minutes
    allocations = []
    for n in range(rng.randrange(1, 6)):
        a = T0 + timedelta(seconds=rng.randrange(span * 60))
        allocations.append(
            Allocation(f"job-{n}", 1, a, a + timedelta(seconds=rng.randrange(60, span * 30)))
        )
    start = T0 + timedelta(seconds=rng.randrange(120))
    end = T0 + timedelta(minutes=span, seconds=-rng.randrange(120))
    cuts = [T0 + timedelta(seconds=rng.randrange(span * 60)) for _ in range(2)]
    segments = segment_gpu(1, allocations, start, end, cuts)
    minutes = sorted(
        {T0 + MINUTE * m for m in range(-1, span + 1) if rng.random() < 0.3}
        | {T0 + MINUTE * m for m in range(100, 100 + rng.randrange(200))}
    )
    assert without_stretches(segments, _stretches(minutes)) == _minute_by_minute(segments, minutes)


def test_no_stretches_leave_the_segments_alone() -> None:
    seg = Segment(1, T0, T0 + MINUTE * 90, ("job-a",))
    assert without_stretches([seg], []) == [seg]
    assert without_stretches([seg], [(T0 - MINUTE, T0 + MINUTE * 91)]) == []
