"""The waste model over jobs: worked example, gaps, edges, sharing, prices, lost GPUs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from service.costs.integrals import INTEGRAL_FIELDS, ActivityPoint, Integrals, Thresholds, integrate
from service.costs.money import figures
from service.costs.prices import PriceRow, change_points, price_at, specificity
from service.costs.recommend import FixAssumptions
from service.costs.waste import (
    UNALLOCATED,
    Allocation,
    Segment,
    Summary,
    Usage,
    group_segments,
    plan_reads,
    segment_gpu,
    summarize,
)
from tests.oracles import lines_from_segments, point_of

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
GIB = 1024**3
TH = Thresholds()


def P(ts: float, sm_active: float, fb_used_bytes: float | None = None) -> ActivityPoint:
    """A GPM-like sample with no kernel while idle (so low activity is nothing running)."""
    values = {"sm_active": sm_active, "fb_used_bytes": fb_used_bytes}
    return point_of(ts, values, Thresholds())


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def usage_from(points: list[ActivityPoint], start: float, end: float) -> Usage:
    i = integrate(points, start, end, TH)
    return Usage(**{f: getattr(i, f) for f in INTEGRAL_FIELDS})


def worked_example_points() -> list[ActivityPoint]:
    """30 min at sm_active 0.0 holding 20 GiB, then 30 min at 0.8, every 10 s."""
    base = T0.timestamp()
    return [P(base + k * 10, 0.0 if k < 180 else 0.8, fb_used_bytes=20 * GIB) for k in range(360)]


def row_of(summary: Summary) -> dict[str, object]:
    return figures(summary, FixAssumptions())


def job_report(
    segments: list[Segment], usages: list[Usage], price: float | None
) -> dict[str, Summary]:
    lines = lines_from_segments(segments, usages, lambda _s: price)
    return summarize(lines, lambda ln: ln.job_id or UNALLOCATED)


def test_worked_example_of_design_4():
    points = worked_example_points()
    segs = segment_gpu(1, [Allocation("j1", 1, T0, at(3600))], T0, at(3600))
    assert [s.job_ids for s in segs] == [("j1",)]
    usage = usage_from(points, T0.timestamp(), at(3600).timestamp())
    row = row_of(job_report(segs, [usage], 4.0)["j1"])
    assert row["allocated_seconds"] == pytest.approx(3600)
    assert row["idle_seconds"] == pytest.approx(1800)
    assert row["idle_held_seconds"] == pytest.approx(1800)
    assert row["unused_seconds"] == pytest.approx(0.6 * 3600)
    assert row["efficiency"] == pytest.approx(0.40)
    assert row["cost_usd"] == pytest.approx(4.00)
    assert row["idle_usd"] == pytest.approx(2.00)
    assert row["nodata_seconds"] == pytest.approx(0)
    assert row["nodata_usd"] == pytest.approx(0) and row["lost_usd"] == pytest.approx(0)


def test_nodata_gap_is_never_idle_nor_waste_but_still_costs_and_max_gap_cuts_cover():
    base = T0.timestamp()
    # Samples at 0..590 s, a 10-minute hole, then 1200..1790 s; all idle.
    pts = [P(base + t, 0.0) for t in [*range(0, 600, 10), *range(1200, 1800, 10)]]
    segs = segment_gpu(1, [Allocation("j", 1, T0, at(1800))], T0, at(1800))
    usage = usage_from(pts, base, base + 1800)
    row = row_of(job_report(segs, [usage], 3.6)["j"])
    # The sample at 590 s covers only max_gap (60 s): 590..650; 650..1200 is nodata.
    assert row["allocated_seconds"] == pytest.approx(650 + 600)
    assert row["nodata_seconds"] == pytest.approx(1800 - 1250)
    assert row["idle_seconds"] == pytest.approx(1250)
    # The GPU was held all 30 minutes: the hole costs too, as nodata, and is never waste.
    assert row["cost_usd"] == pytest.approx(3.6 * 1800 / 3600)
    assert row["nodata_usd"] == pytest.approx(3.6 * 550 / 3600)
    assert row["waste_usd"] == pytest.approx(3.6 * 1250 / 3600)


def test_job_starting_and_ending_between_samples_gets_only_its_part():
    base = T0.timestamp()
    pts = [P(base + k * 10, 0.5) for k in range(10)]  # 0..90 s, covers to 100 s
    segs = segment_gpu(1, [Allocation("j", 1, at(15), at(42))], T0, at(100))
    assert [(s.start, s.end, s.job_ids) for s in segs] == [
        (T0, at(15), ()),
        (at(15), at(42), ("j",)),
        (at(42), at(100), ()),
    ]
    usages = [usage_from(pts, s.start.timestamp(), s.end.timestamp()) for s in segs]
    rep = job_report(segs, usages, 3.6)
    assert rep["j"].usage.covered_seconds == pytest.approx(27)
    assert rep["j"].usage.unused_seconds == pytest.approx(13.5)
    assert rep[UNALLOCATED].usage.covered_seconds == pytest.approx(73)


def test_two_jobs_taking_turns_split_the_gpu_by_time():
    base = T0.timestamp()
    pts = [P(base + k * 10, 0.0 if k < 60 else 1.0) for k in range(120)]
    allocs = [Allocation("a", 1, T0, at(600)), Allocation("b", 1, at(600), at(1200))]
    segs = segment_gpu(1, allocs, T0, at(1200))
    usages = [usage_from(pts, s.start.timestamp(), s.end.timestamp()) for s in segs]
    rep = job_report(segs, usages, 3.6)
    assert row_of(rep["a"])["idle_usd"] == pytest.approx(0.6)
    assert rep["a"].efficiency == pytest.approx(0.0)
    assert rep["b"].efficiency == pytest.approx(1.0)
    assert row_of(rep["b"])["waste_usd"] == pytest.approx(0.0)
    assert UNALLOCATED not in rep


def test_two_jobs_sharing_one_gpu_at_once_split_it_equally():
    base = T0.timestamp()
    pts = [P(base + k * 10, 0.0, fb_used_bytes=4 * GIB) for k in range(360)]
    # a holds 0..60 min, b joins at 30 min: 0..30 a alone, 30..60 both.
    allocs = [Allocation("a", 1, T0, at(3600)), Allocation("b", 1, at(1800), at(3600))]
    segs = segment_gpu(1, allocs, T0, at(3600))
    assert [s.job_ids for s in segs] == [("a",), ("a", "b")]
    usages = [usage_from(pts, s.start.timestamp(), s.end.timestamp()) for s in segs]
    rep = job_report(segs, usages, 4.0)
    assert rep["a"].held_seconds == pytest.approx(1800 + 900)
    assert rep["b"].held_seconds == pytest.approx(900)
    assert rep["a"].cost_usd == pytest.approx(3.0)
    assert rep["b"].cost_usd == pytest.approx(1.0)
    # The shares add up to the GPU's hour: nothing counted twice.
    assert sum(s.cost_usd for s in rep.values()) == pytest.approx(4.0)


def test_api_and_observed_intervals_of_one_job_count_once():
    allocs = [Allocation("j", 1, T0, at(600)), Allocation("j", 1, at(300), at(900))]
    segs = segment_gpu(1, allocs, T0, at(900))
    assert [(s.start, s.end, s.job_ids) for s in segs] == [(T0, at(900), ("j",))]


def test_price_change_in_the_middle_of_a_job():
    rows = [
        PriceRow("*H100*", 4.0, T0 - timedelta(days=30)),
        PriceRow("*H100*", 2.0, at(1800)),
    ]
    model = "NVIDIA H100 80GB HBM3"
    cuts = change_points(rows, model, T0, at(3600))
    assert cuts == [at(1800)]
    segs = segment_gpu(1, [Allocation("j", 1, T0, at(3600))], T0, at(3600), cuts)
    assert len(segs) == 2
    base = T0.timestamp()
    pts = [P(base + k * 10, 0.5) for k in range(360)]
    usages = [usage_from(pts, s.start.timestamp(), s.end.timestamp()) for s in segs]

    def price_of(seg: Segment) -> float | None:
        row = price_at(rows, model, seg.start)
        return row.usd_per_gpu_hour if row else None

    lines = lines_from_segments(segs, usages, price_of)
    rep = row_of(summarize(lines, lambda ln: ln.job_id or UNALLOCATED)["j"])
    assert rep["cost_usd"] == pytest.approx(2.0 + 1.0)


def test_most_specific_pattern_wins_and_unmatched_is_none_not_zero():
    rows = [
        PriceRow("*", 1.0, T0),
        PriceRow("*H100*", 4.0, T0),
        PriceRow("NVIDIA H100 80GB HBM3", 5.0, T0),
        PriceRow("*L4", 0.8, T0),
        PriceRow("*L40S*", 1.9, T0),
    ]
    assert price_at(rows, "NVIDIA H100 80GB HBM3", at(1)).usd_per_gpu_hour == 5.0  # type: ignore[union-attr]
    assert price_at(rows, "NVIDIA H100 PCIe", at(1)).usd_per_gpu_hour == 4.0  # type: ignore[union-attr]
    assert price_at(rows, "nvidia l40s", at(1)).usd_per_gpu_hour == 1.9  # type: ignore[union-attr]
    assert price_at(rows, "NVIDIA L4", at(1)).usd_per_gpu_hour == 0.8  # type: ignore[union-attr]
    assert price_at(rows, "NVIDIA H100 PCIe", T0 - timedelta(seconds=1)) is None
    assert specificity("*A100*40GB*") == 8


def test_unpriced_gpu_shows_null_cost_not_zero():
    segs = [Segment(1, T0, at(3600), ("j",))]
    rep = job_report(segs, [Usage(covered_seconds=3600, unused_seconds=1800)], None)
    row = row_of(rep["j"])
    assert row["cost_usd"] is None and row["waste_usd"] is None and row["idle_usd"] is None
    assert row["unpriced_seconds"] == 3600
    assert row["efficiency"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        # 08:00:30 .. 10:10:15: 1h 09-10; the 59 minutes 08:01-09:00 as the hour 08-09 minus
        # the minute 08:00; 10:00-10:10 as 1m; 30 s and 15 s raw at the edges.
        (
            at(30),
            at(2 * 3600 + 615),
            [
                ("1h", at(3600), at(7200), 1),
                ("1h", T0, at(3600), 1),
                ("1m", T0, at(60), -1),
                ("1m", at(7200), at(7800), 1),
                ("raw", at(30), at(60), 1),
                ("raw", at(7800), at(7815), 1),
            ],
        ),
        # exactly on hour boundaries: one 1h read only
        (T0, at(7200), [("1h", T0, at(7200), 1)]),
        # inside one minute: raw only
        (at(5), at(50), [("raw", at(5), at(50), 1)]),
        # inside one hour, a few minutes: 1m directly
        (
            at(90),
            at(200),
            [
                ("1m", at(120), at(180), 1),
                ("raw", at(90), at(120), 1),
                ("raw", at(180), at(200), 1),
            ],
        ),
        # inside one hour, most of it: the hour minus the minutes outside
        (
            at(30),
            at(3000),
            [
                ("1h", T0, at(3600), 1),
                ("1m", T0, at(60), -1),
                ("1m", at(3000), at(3600), -1),
                ("raw", at(30), at(60), 1),
            ],
        ),
        # across one hour boundary, no whole hour: each side on its own
        (
            at(610),
            at(4805),
            [
                ("1h", T0, at(3600), 1),
                ("1m", T0, at(660), -1),
                ("1m", at(3600), at(4800), 1),
                ("raw", at(610), at(660), 1),
                ("raw", at(4800), at(4805), 1),
            ],
        ),
    ],
)
def test_reads_use_hours_inside_and_finer_data_only_at_the_edges(start, end, expected):
    assert [(r.kind, r.start, r.end, r.sign) for r in plan_reads(start, end)] == expected


@pytest.mark.parametrize(
    ("start_s", "end_s"), [(33, 13_500), (33, 3_000), (610, 4_805), (1_799, 5_401), (0, 3_600)]
)
def test_rollup_boundaries_add_up_to_the_raw_integral(start_s: float, end_s: float):
    """Summing the signed planned reads equals integrating the whole span at once."""
    base = T0.timestamp()
    pts = [P(base + k * 7, (k % 10) / 10, fb_used_bytes=2 * GIB) for k in range(2000)]
    start, end = at(start_s), at(end_s)
    whole = usage_from(pts, start.timestamp(), end.timestamp())
    parts = Usage()
    for r in plan_reads(start, end):
        # A 1h/1m read is the sum of its minute buckets, as the rollups store them.
        t = r.start
        step = timedelta(minutes=1) if r.kind != "raw" else r.end - r.start
        while t < r.end:
            parts.add(usage_from(pts, t.timestamp(), (t + step).timestamp()), r.sign)
            t += step
    for f in ("covered_seconds", "idle_seconds", "idle_held_seconds", "unused_seconds"):
        assert getattr(parts, f) == pytest.approx(getattr(whole, f))


def test_a_lost_gpu_s_unsampled_time_is_lost_not_nodata_and_still_costs():
    """Cut at lost_at: before it a hole is nodata, after it the time is lost; both cost."""
    lost_at = at(2400)
    base = T0.timestamp()
    # Samples 0..1790 s; the last covers max_gap (60 s), to 1850 s.
    pts = [P(base + k * 10, 0.0) for k in range(180)]
    segs = segment_gpu(1, [Allocation("j", 1, T0, at(3600))], T0, at(3600), [lost_at])
    usages = [usage_from(pts, s.start.timestamp(), s.end.timestamp()) for s in segs]
    keys, held, _ = group_segments(segs, lambda _s: 3.6, {1: lost_at})
    assert [(k[0], k[3]) for k in keys] == [("j", False), ("j", True)]
    assert held == [2400, 1200]
    lines = lines_from_segments(segs, usages, lambda _s: 3.6, {1: lost_at})
    row = row_of(summarize(lines, lambda ln: ln.job_id or UNALLOCATED)["j"])
    assert row["nodata_seconds"] == pytest.approx(550)
    assert row["lost_seconds"] == pytest.approx(1200)
    assert row["cost_usd"] == pytest.approx(3.6)
    assert row["lost_usd"] == pytest.approx(1.2) and row["nodata_usd"] == pytest.approx(0.55)
    assert row["waste_usd"] == pytest.approx(1.85)  # the idle sampled time only


def test_running_total_columns_are_the_usage_fields_in_order():
    # cost_sums builds Usage(*totals) from the cum_* columns by position.
    from service.costs.waste import USAGE_FIELDS
    from service.db.schema import CUMULATIVE_FIELDS

    assert CUMULATIVE_FIELDS == USAGE_FIELDS


def test_usage_add_covers_every_field():
    # Usage.add spells its fields out for speed; a new field must not be left out of it.
    from dataclasses import fields

    other = Usage(*(float(i + 1) for i in range(len(fields(Usage)))))
    total = Usage()
    total.add(other, 2.0)
    total.add(Integrals(covered_seconds=1.0))
    for i, f in enumerate(fields(Usage)):
        want = 2.0 * (i + 1) + (1.0 if f.name == "covered_seconds" else 0.0)
        assert getattr(total, f.name) == want, f.name


def test_price_lookup_agrees_with_price_at():
    from datetime import UTC, datetime, timedelta

    from service.costs.prices import price_lookup

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [
        PriceRow("*H100*", 4.0, t0),
        PriceRow("NVIDIA H100 80GB HBM3", 3.5, t0 + timedelta(days=10)),  # more specific
        PriceRow("*H100*", 3.0, t0 + timedelta(days=20)),  # newer but less specific
        PriceRow("*A100*", 2.0, t0 + timedelta(days=5)),
    ]
    lookup = price_lookup(rows)
    for model in ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB", "L4"):
        for day in range(-2, 30):
            when = t0 + timedelta(days=day, hours=7)
            assert lookup(model, when) == price_at(rows, model, when), (model, day)
    row = lookup("NVIDIA H100 80GB HBM3", t0 + timedelta(days=25))
    assert row is not None and row.usd_per_gpu_hour == 3.5
