"""The periodic report in GPU-hours: beside the dollars, and alone for a site without prices
(GPUWARDEN_PRICES=none), never "$0" or "n/a"."""

from __future__ import annotations

from datetime import UTC, datetime

from service.costs.periodic import JobLine, Period, Ranked, Report, Totals
from service.costs.report_render import render

WEEK = Period(datetime(2026, 11, 30, tzinfo=UTC), datetime(2026, 12, 7, tzinfo=UTC), "weekly")


def report(priced: bool) -> Report:
    usd = (lambda v: v) if priced else (lambda v: None)
    totals = Totals(96.0, usd(384.0), usd(166.0), usd(83.0), usd(83.0), 2, {},
                    waste_gpu_hours=41.5, idle_gpu_hours=20.75, fixable_gpu_hours=20.75)  # fmt: skip
    before = Totals(90.0, usd(360.0), usd(120.0), usd(60.0), usd(60.0), 2, {},
                    waste_gpu_hours=30.0, idle_gpu_hours=15.0, fixable_gpu_hours=15.0)  # fmt: skip
    job = JobLine("slurm:7", "alice", "ml", 64.0, usd(256.0), usd(120.0), "idle_held", None, None,
                  "https://warden.example/jobs/slurm%3A7", waste_gpu_hours=30.0)  # fmt: skip
    ranked = Ranked("alice", usd(166.0), usd(384.0), "idle_held",
                    "https://warden.example/users/alice", waste_gpu_hours=41.5)  # fmt: skip
    return Report("admins", "", WEEK, totals, before, [job], "https://warden.example/costs",
                  worst_users=[ranked])  # fmt: skip


def test_gpu_hours_stand_beside_the_dollars() -> None:
    r = render(report(priced=True))
    assert r.subject.endswith(": $166.00 of $384.00 wasted")
    assert "Waste: $166.00 = idle $83.00 + fixable $83.00 (estimated)" in r.text
    assert "Waste in GPU-hours: 41.50 of 96.00 = idle 20.75 + fixable 20.75 (estimated)" in r.text
    assert "waste $120.00, top cause idle_held; 30.00 GPU-h wasted" in r.text
    assert "1. alice: waste $166.00 of $384.00, top cause idle_held; 41.50 GPU-h wasted" in r.text
    assert "30.00 GPU-h wasted" in r.html


def test_a_site_without_prices_reads_gpu_hours_alone() -> None:
    r = render(report(priced=False))
    assert r.subject.endswith(": 41.50 of 96.00 GPU-h wasted")
    assert "Cost:" not in r.text and "Waste: " not in r.text
    assert "Waste in GPU-hours: 41.50 of 96.00 = idle 20.75 + fixable 20.75" in r.text
    assert "Change since the week before: held +6.00 GPU-h, waste +11.50 GPU-h" in r.text
    assert "n/a" not in r.text.split("Costliest jobs")[0]
