"""Terminal tables that fit the terminal without cutting what matters (dollars, ids).

Columns that must stay whole never wrap or shrink; when the table is too wide the columns of
least value are left out first, in the order their ``drop`` rank gives, and only then do the
columns that may wrap (tags, users) wrap.

The table is laid out by plain padding, drawn as rich's default table draws it (heavy head,
title and caption centred over it): a fleet of 1,000 GPUs is 10,000 cells, which a general
layout engine takes a second of CPU to measure and a padding loop lays out in milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions
    from rich.segment import Segment

# Each column costs its padding (one space either side) and one border; plus the left border.
_PER_COLUMN = 3
# The narrowest a folded id gets.
_FOLD_MIN_WIDTH = 8


@dataclass(frozen=True, slots=True)
class Column:
    """A column: ``whole`` ones are never cut; ``drop`` > 0 may be left out, lowest first."""

    name: str
    justify: Literal["left", "right"] = "left"
    whole: bool = False
    drop: int = 0
    wrap: bool = False
    fold_last: bool = False  # whole, but folded onto more lines (never cut) if nothing else fits


def _lines(text: str) -> list[str]:
    return text.splitlines() or [""]


def _natural(col: Column, cells: Sequence[str]) -> int:
    return max(len(line) for t in (col.name, *cells) for line in _lines(t))


def _width(col: Column, cells: Sequence[str]) -> int:
    if col.wrap:  # it can wrap down to its longest word
        return max(len(word) for t in (col.name, *cells) for word in (t.split() or [""]))
    return _natural(col, cells)


def _fold(word: str, width: int) -> list[str]:
    return [word[i : i + width] for i in range(0, len(word), width)] or [""]


def wrap(text: str, width: int) -> list[str]:
    """``text`` on lines of at most ``width`` characters: broken between words, and a word
    longer than a line folded onto several (no character is lost)."""
    out: list[str] = []
    for line in _lines(text):
        if len(line) <= width:
            out.append(line)
            continue
        current = ""
        for word in line.split():
            if current and len(current) + 1 + len(word) <= width:
                current += " " + word
                continue
            if current:
                out.append(current)
            pieces = _fold(word, width)
            out += pieces[:-1]
            current = pieces[-1]
        out.append(current)
    return out


def _centred(text: str, width: int) -> list[str]:
    lines = wrap(text, width)
    return [" " * ((width - len(t)) // 2) + t + " " * (width - len(t) - (width - len(t)) // 2)
            for t in lines]  # fmt: skip


@dataclass
class PlainTable:
    """A laid-out table: its columns' texts, widths and alignment, and the rows' cells."""

    names: list[str]
    justify: list[str]
    widths: list[int]
    rows: list[list[str]]
    title: str | None = None
    caption: str | None = None
    # Row positions after which a line is drawn (the totals row's own section).
    sections: set[int] = field(default_factory=set)

    def _rule(self, left: str, fill: str, cross: str, right: str) -> str:
        return left + cross.join(fill * (w + 2) for w in self.widths) + right

    def _row(self, cells: Sequence[str], edge: str) -> list[str]:
        wrapped = [wrap(c, w) for c, w in zip(cells, self.widths, strict=True)]
        height = max(len(w) for w in wrapped)
        out = []
        for n in range(height):
            parts = []
            for lines, w, j in zip(wrapped, self.widths, self.justify, strict=True):
                t = lines[n] if n < len(lines) else ""
                parts.append(t.rjust(w) if j == "right" else t.ljust(w))
            out.append(edge + " " + f" {edge} ".join(parts) + " " + edge)
        return out

    def lines(self) -> list[str]:
        """The table's lines, title first and caption last, without line ends."""
        width = 1 + sum(w + _PER_COLUMN for w in self.widths)
        out = _centred(self.title, width) if self.title else []
        out.append(self._rule("┏", "━", "┳", "┓"))
        out += self._row(self.names, "┃")
        out.append(self._rule("┡", "━", "╇", "┩"))
        for n, row in enumerate(self.rows):
            out += self._row(row, "│")
            if n in self.sections and n != len(self.rows) - 1:
                out.append(self._rule("├", "─", "┼", "┤"))
        out.append(self._rule("└", "─", "┴", "┘"))
        if self.caption:
            out += _centred(self.caption, width)
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        """One segment a line: rich prints the laid-out text and measures nothing. A line
        wider than the console goes on in the next line, as a terminal wraps it (never cut)."""
        from rich.segment import Segment

        step = max(options.max_width, 1)
        for line in self.lines():
            for at in range(0, max(len(line), 1), step):
                yield Segment(line[at : at + step])
                yield Segment.line()


def _layout(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], keep: list[int], width: int
) -> list[int]:
    """The widths of the ``keep`` columns: each as wide as its widest cell, then the widest of
    those that may wrap (then of those that may fold) narrowed, a character at a time, until
    the table fits or none can give more (the terminal then wraps the lines)."""
    natural = [_natural(columns[i], [r[i] for r in rows]) for i in keep]
    least = []
    for k, i in enumerate(keep):
        c = columns[i]
        if c.wrap:
            least.append(_width(c, [r[i] for r in rows]))
        elif c.fold_last:
            least.append(min(natural[k], _FOLD_MIN_WIDTH))
        else:
            least.append(natural[k])
    widths = list(natural)
    excess = 1 + sum(w + _PER_COLUMN for w in widths) - width
    # The wrapping columns give way first; an id folds only when they cannot give more.
    for gives in ([k for k, i in enumerate(keep) if columns[i].wrap],
                  [k for k, i in enumerate(keep) if columns[i].fold_last]):  # fmt: skip
        while excess > 0 and gives:
            slack, k = max((widths[k] - least[k], k) for k in gives)
            if slack <= 0:
                break
            widths[k] -= 1
            excess -= 1
    return widths


def fit_table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    width: int,
    title: str | None = None,
    caption: str | None = None,
    section_before_last: bool = False,
) -> tuple[PlainTable, list[str]]:
    """A table of ``rows`` that fits ``width`` columns, and the names of the columns left out."""
    keep = list(range(len(columns)))
    widths = [_width(c, [r[i] for r in rows]) for i, c in enumerate(columns)]

    def needed() -> int:
        return 1 + sum(widths[i] + _PER_COLUMN for i in keep)

    for i in sorted((i for i, c in enumerate(columns) if c.drop), key=lambda i: columns[i].drop):
        if needed() <= width:
            break
        keep.remove(i)
    table = PlainTable(
        names=[columns[i].name for i in keep],
        justify=[columns[i].justify for i in keep],
        widths=_layout(columns, rows, keep, width),
        rows=[[row[i] for i in keep] for row in rows],
        title=title,
        caption=caption,
        sections={len(rows) - 2} if section_before_last else set(),
    )
    dropped = [c.name for i, c in enumerate(columns) if i not in keep]
    return table, dropped
