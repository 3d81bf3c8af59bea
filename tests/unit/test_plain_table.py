"""The CLI's tables laid out by plain padding: the same text rich's table drew wherever the
table fits, and narrower terminals folded or wrapped without losing a character."""

from __future__ import annotations

import io
from collections.abc import Sequence

import pytest
from rich.console import Console
from rich.table import Table

from service.cli.fleet import FLEET_COLUMNS, fleet_rows
from service.cli.report import _table_cells, _table_columns
from service.cli.tables import Column, fit_table, wrap

GIB = 1024**3


def rich_reference(
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    title: str | None,
    caption: str | None,
    section_before_last: bool,
) -> Table:
    """The table as rich laid it out before (every column kept: the terminal is wide)."""
    table = Table(title=title, caption=caption)
    for c in columns:
        table.add_column(c.name, justify=c.justify, no_wrap=True)
    for n, row in enumerate(rows):
        table.add_row(*row, end_section=section_before_last and n == len(rows) - 2)
    return table


def printed(renderable: object, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, legacy_windows=False).print(renderable)
    return out.getvalue()


def fleet(count: int) -> list[dict[str, object]]:
    states = ["idle-held", "working", "idle", "underused", "lost", "no data"]
    return [
        {
            "node": f"gpu-node-{n // 8:04d}",
            "index": n % 8,
            "model": "NVIDIA H100 80GB HBM3",
            "fb_total_bytes": 80 * GIB,
            "latest": {"fb_used_bytes": (n % 80) * GIB} if n % 7 else {},
            "memory_unknown": n % 14 == 0,
            "activity": (n % 100) / 100,
            "cause": "compute_tensor" if n % 3 else "launch_bound",
            "state": states[n % len(states)],
            "job": f"slurm:{100000 + n}" if n % 5 else None,
            "user": f"user{n % 37}" if n % 5 else None,
            "cost_usd": 4.0 * (n % 11),
            "waste_usd": 1.25 * (n % 13) if n % 4 else None,
        }
        for n in range(count)
    ]


def report_rows() -> list[list[str]]:
    def row(key: str, waste: float, **extra: object) -> dict[str, object]:
        return {"key": key, "held_seconds": 86400.0, "allocated_seconds": 80000.0,
                "nodata_seconds": 6400.0, "lost_seconds": 0.0, "efficiency": 0.42,
                "cost_usd": 96.0, "waste_usd": waste, "idle_usd": waste / 4,
                "fixable_usd": waste * 3 / 4, "nodata_usd": 7.1, "lost_usd": 0.0,
                "top_cause": "idle_held",
                "causes": {"idle_held": {"seconds": 40000.0, "usd": 48.0, "waste_usd": waste}},
                "fixes": [{"saving_usd": waste, "cause": "idle_held", "kind": "cause"}],
                "user": "alice", **extra}  # fmt: skip

    shown = [row(f"slurm:{n}", 10.0 * n) for n in range(1, 9)]
    shown.append(row("TOTAL", 360.0, user=None, fixes=[], top_cause=None))
    return [_table_cells(r, "job") for r in shown]


@pytest.mark.parametrize("title_words", [3, 40])
def test_the_fleet_prints_as_rich_printed_it_where_it_fits(title_words: int) -> None:
    rows = fleet_rows(fleet(50))
    title = " ".join(["word"] * title_words)  # 40 words wrap over the table's width
    table, dropped = fit_table(FLEET_COLUMNS, rows, width=200, title=title)
    assert dropped == []
    reference = rich_reference(
        FLEET_COLUMNS, rows, title=title, caption=None, section_before_last=False
    )
    assert printed(table, 200) == printed(reference, 200)


def test_the_cost_report_prints_as_rich_printed_it_with_its_totals_section() -> None:
    columns = _table_columns("job")
    rows = report_rows()
    caption = "prices: DEFAULT prices, set them with PUT /api/v1/prices"
    table, dropped = fit_table(
        columns, rows, width=250, title="GPU cost by job", caption=caption,
        section_before_last=True,
    )  # fmt: skip
    assert dropped == []
    reference = rich_reference(
        columns, rows, title="GPU cost by job", caption=caption, section_before_last=True
    )
    assert printed(table, 250) == printed(reference, 250)


def test_a_narrow_terminal_wraps_and_folds_without_losing_a_character() -> None:
    columns = [
        Column("id", whole=True, fold_last=True),
        Column("$", "right", whole=True),
        Column("tags", wrap=True),
    ]
    job = "k8s:ml-platform-research/llama-70b-finetune-sweep-000017"
    rows = [[job, "$1,234.56", "idle_held 50% $3.00 launch_bound 20% $1.00"]]
    table, dropped = fit_table(columns, rows, width=40)
    lines = str(table).splitlines()
    assert dropped == [] and all(len(line) == 40 for line in lines)
    body = [line.split("│")[1:-1] for line in lines if line.startswith("│")]
    assert "".join(cells[0].strip() for cells in body) == job
    assert body[0][1].strip() == "$1,234.56"  # whole, on the first line
    assert " ".join(c[2].strip() for c in body if c[2].strip()) == rows[0][2]


def test_a_table_wider_than_the_terminal_goes_on_in_the_next_line_never_cut() -> None:
    columns = [Column("node", whole=True), Column("$ waste", "right", whole=True)]
    rows = [["node-with-a-very-long-name-0001", "$123,456.78"]]
    table, _ = fit_table(columns, rows, width=20)
    text = printed(table, 20)
    assert all(len(line) <= 20 for line in text.splitlines())
    assert "".join(text.splitlines()).count("$123,456.78") == 1


def test_wrap_keeps_every_character() -> None:
    assert wrap("ab cd ef", 5) == ["ab cd", "ef"]
    assert wrap("abcdefghij k", 4) == ["abcd", "efgh", "ij k"]
    assert wrap("", 3) == [""]
    assert wrap("one\ntwo three", 5) == ["one", "two", "three"]
