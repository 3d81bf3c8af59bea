"""Terminal tables that fit the terminal without cutting what matters (dollars, ids).

Columns that must stay whole never wrap or shrink; when the table is too wide the columns of
least value are left out first, in the order their ``drop`` rank gives, and only then do the
columns that may wrap (tags, users) wrap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.table import Table

# Each column costs its padding (one space either side) and one border; plus the left border.
_PER_COLUMN = 3


@dataclass(frozen=True, slots=True)
class Column:
    """A column: ``whole`` ones are never cut; ``drop`` > 0 may be left out, lowest first."""

    name: str
    justify: Literal["left", "right"] = "left"
    whole: bool = False
    drop: int = 0
    wrap: bool = False
    fold_last: bool = False  # whole, but folded onto more lines (never cut) if nothing else fits


def _width(col: Column, cells: Sequence[str]) -> int:
    texts = [col.name, *cells]
    if col.wrap:  # it can wrap down to its longest word
        return max(len(word) for t in texts for word in (t.split() or [""]))
    return max(len(line) for t in texts for line in (t.splitlines() or [""]))


def fit_table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    width: int,
    title: str | None = None,
    caption: str | None = None,
    section_before_last: bool = False,
) -> tuple[Table, list[str]]:
    """A table of ``rows`` that fits ``width`` columns, and the names of the columns left out."""
    keep = list(range(len(columns)))
    widths = [_width(c, [r[i] for r in rows]) for i, c in enumerate(columns)]

    def needed() -> int:
        return 1 + sum(widths[i] + _PER_COLUMN for i in keep)

    for i in sorted((i for i, c in enumerate(columns) if c.drop), key=lambda i: columns[i].drop):
        if needed() <= width:
            break
        keep.remove(i)
    folding = set()
    if needed() > width:  # even without the droppable columns: fold the id onto more lines
        folding = {i for i in keep if columns[i].fold_last}
    table = Table(title=title, caption=caption)
    for i in keep:
        c = columns[i]
        if i in folding:
            table.add_column(c.name, justify=c.justify, overflow="fold", min_width=8)
        elif c.wrap:  # only these give way when the terminal is narrow
            table.add_column(c.name, justify=c.justify, overflow="fold", min_width=widths[i])
        else:
            table.add_column(c.name, justify=c.justify, no_wrap=True, min_width=widths[i])
    for n, row in enumerate(rows):
        last_of_body = section_before_last and n == len(rows) - 2
        table.add_row(*(row[i] for i in keep), end_section=last_of_body)
    dropped = [c.name for i, c in enumerate(columns) if i not in keep]
    return table, dropped
