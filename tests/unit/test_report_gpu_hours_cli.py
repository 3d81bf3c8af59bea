"""``gpuwarden report cost`` for a site without prices: GPU-hours where the dollars would be,
never $0 or n/a; and ``--group-by`` taking namespace and label:<key>."""

from __future__ import annotations

import argparse
import io

import pytest
from rich.console import Console

from service.cli.report import group_by_arg, render_table


def row(key: str, held_hours: float, waste_hours: float) -> dict[str, object]:
    return {
        "key": key, "held_seconds": held_hours * 3600, "allocated_seconds": held_hours * 3600,
        "nodata_seconds": 0.0, "lost_seconds": 0.0, "efficiency": 0.3, "cost_usd": None,
        "waste_usd": None, "idle_usd": None, "fixable_usd": None, "nodata_usd": None,
        "lost_usd": None, "held_gpu_hours": held_hours, "waste_gpu_hours": waste_hours,
        "idle_gpu_hours": waste_hours / 2, "fixable_gpu_hours": waste_hours / 2,
    }  # fmt: skip


def render(unit: str) -> str:
    data = {
        "group_by": "namespace", "start": "2026-12-01T00:00:00Z", "end": "2026-12-02T00:00:00Z",
        "rows": [row("ml-team", 96.0, 41.5)], "totals": row("__total__", 96.0, 41.5),
        "price_source": "none", "unit": unit, "warnings": [],
    }  # fmt: skip
    out = io.StringIO()
    render_table(data, limit=20, console=Console(file=out, width=200, color_system=None))
    return out.getvalue()


def test_a_site_without_prices_reads_gpu_hours_not_n_a() -> None:
    text = render("gpu_hours")
    assert "n/a" not in text and "$" not in text
    assert "96.0 GPU-h" in text and "41.5 GPU-h" in text and "20.8 GPU-h" in text
    assert "no prices: figures are GPU-hours" in text
    assert "held 96.0 GPU-h (no data 0, lost 0); waste 41.5 GPU-h = idle 20.8 + fixable 20.8" in (
        text
    )


def test_group_by_takes_namespace_and_any_label() -> None:
    assert group_by_arg("namespace") == "namespace"
    assert group_by_arg("label:app.kubernetes.io/name") == "label:app.kubernetes.io/name"
    for bad in ("label:", "pods", "label:" + "k" * 64):
        with pytest.raises(argparse.ArgumentTypeError):
            group_by_arg(bad)


def test_prices_from_opencost_are_named_so() -> None:
    data = {
        "group_by": "job", "start": "2026-12-01T00:00:00Z", "end": "2026-12-02T00:00:00Z",
        "rows": [], "totals": {**row("__total__", 1.0, 0.5), "cost_usd": 2.5, "waste_usd": 1.25,
                               "idle_usd": 0.6, "fixable_usd": 0.65, "nodata_usd": 0.0,
                               "lost_usd": 0.0},
        "price_source": "opencost", "unit": "usd", "warnings": [],
    }  # fmt: skip
    out = io.StringIO()
    render_table(data, limit=20, console=Console(file=out, width=200, color_system=None))
    assert "prices from OpenCost" in out.getvalue()


def test_gpuwarden_job_says_the_waste_in_gpu_hours() -> None:
    from service.cli.fleet import _money_lines

    lines = _money_lines({**row("slurm:9", 1.0, 0.8), "idle_gpu_hours": 0.5,
                          "fixable_gpu_hours": 0.3})  # fmt: skip
    assert "Waste in GPU-hours: 0.80 = idle 0.50 + fixable 0.30" in lines
