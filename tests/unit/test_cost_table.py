"""The cost table in an 80-column terminal: dollar figures and job ids whole, never cut."""

from __future__ import annotations

import io

from rich.console import Console

from service.cli.report import gpu_hours, render_table


def row(key: str, cost: float, waste: float, **extra: object) -> dict[str, object]:
    return {
        "key": key,
        "held_seconds": 86400.0 * 8,
        "allocated_seconds": 86400.0 * 7.5,
        "nodata_seconds": 43200.0,
        "lost_seconds": 0.0,
        "idle_seconds": 3600.0 * 50,
        "unused_seconds": 3600.0 * 90,
        "efficiency": 0.42,
        "cost_usd": cost,
        "waste_usd": waste,
        "idle_usd": waste / 4,
        "fixable_usd": waste * 3 / 4,
        "nodata_usd": cost / 16,
        "lost_usd": 0.0,
        "waste_gpu_hours": waste / 4.0,
        "user": "alice-the-researcher",
        **extra,
    }


def report() -> dict[str, object]:
    rows = [
        row("slurm:1234567", 12345.67, 9876.54),
        row("k8s:ml-team/train-llama-70b-x9", 1234.5, 1000.25),
        row("__unallocated__", 123.45, 99.99, user=None),
    ]
    totals = row("__total__", 13703.62, 10976.78, user=None)
    return {
        "group_by": "job",
        "start": "2026-11-26T07:22:24.643342Z",
        "end": "2026-12-03T07:22:24.643342Z",
        "rows": rows,
        "totals": totals,
        "price_source": "default",
        "warnings": [],
    }


def render(width: int) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, legacy_windows=False)
    render_table(report(), limit=20, console=console)
    return out.getvalue()


def test_80_columns_keep_every_dollar_figure_and_job_id_whole() -> None:
    text = render(80)
    assert max(len(line) for line in text.splitlines()) <= 80
    body = [line for line in text.splitlines() if line.startswith("│")]
    assert body and all(line.endswith("│") for line in body)  # not cropped at the edge
    assert "…" not in text
    for figure in ("$12,345.67", "$9,876.54", "$1,234.50", "$1,000.25", "$13,703.62", "$10,976.78"):
        assert figure in text, figure
    for job in ("slurm:1234567", "k8s:ml-team/train-llama-70b-x9", "__unallocated__"):
        assert job in text, job
    assert "left out to fit 80 columns" in text
    assert "DEFAULT prices" in text


def test_a_wide_terminal_shows_every_column() -> None:
    text = render(200)
    assert "no data" in text and "fixable" in text and "left out" not in text
    # The totals line says the waste as idle + fixable.
    assert "waste $10,976.78 (2,744.2 GPU-h) = idle $2,744.20 + fixable $8,232.59" in text


def test_small_gpu_hours_do_not_read_as_nothing() -> None:
    # $0.21 at $6.88/h is 0.03 GPU-h, not "0.0"
    assert gpu_hours(0.21 / 6.88 * 3600) == "0.03"
    assert gpu_hours(10) == "<0.01"
    assert gpu_hours(0) == "0"
    assert gpu_hours(36 * 3600) == "36.0"


def test_a_job_id_too_long_for_the_terminal_folds_and_the_dollars_stay_whole() -> None:
    job = "k8s:ml-platform-research/llama-70b-finetune-sweep-lr3e-5-bs256-run-000017"
    data = report()
    data["rows"] = [row(job, 12345.67, 9876.54)]
    out = io.StringIO()
    console = Console(file=out, width=80, color_system=None, legacy_windows=False)
    render_table(data, limit=20, console=console)
    text = out.getvalue()
    body = [line for line in text.splitlines() if line.startswith("│")]
    assert body and all(len(line) <= 80 and line.endswith("│") for line in body)
    assert "$12,345.67" in text and "$9,876.54" in text and "…" not in text
    first_cells = "".join(line.split("│")[1].strip() for line in body[:-1])
    assert first_cells == job  # folded onto several lines, every character kept
