"""GPU price table logic: shell-style model patterns to USD per GPU-hour, with effective-from dates.

Pure: takes price rows and a GPU model name, returns prices. Patterns match the model name
case-insensitively; the most specific matching pattern (most literal characters) wins, and
within one pattern the newest row whose effective_from is not after the moment in question.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from fnmatch import fnmatchcase


@dataclass(frozen=True, slots=True)
class PriceRow:
    """One row of the price table: ``usd_per_gpu_hour`` for models matching ``model_pattern``."""

    model_pattern: str
    usd_per_gpu_hour: float
    effective_from: datetime
    note: str | None = None


_WILDCARD = re.compile(r"\[[^\]]*\]|[*?]")


def specificity(pattern: str) -> int:
    """How specific ``pattern`` is: its number of literal (non-wildcard) characters."""
    return len(_WILDCARD.sub("", pattern))


def matches(pattern: str, model: str) -> bool:
    """Whether shell-style ``pattern`` matches GPU model name ``model`` (case-insensitive)."""
    return fnmatchcase(model.lower(), pattern.lower())


def price_at(rows: Sequence[PriceRow], model: str, when: datetime) -> PriceRow | None:
    """The row pricing ``model`` at ``when``, or None when no pattern matches (never $0)."""
    best: PriceRow | None = None
    for row in rows:
        if row.effective_from > when or not matches(row.model_pattern, model):
            continue
        if best is None or (specificity(row.model_pattern), row.effective_from) > (
            specificity(best.model_pattern),
            best.effective_from,
        ):
            best = row
    return best


def price_lookup(rows: Sequence[PriceRow]) -> Callable[[str, datetime], PriceRow | None]:
    """``price_at`` over ``rows`` for many (model, when): each model's prices are worked out
    once as a timeline, then each call is a binary search."""
    timelines: dict[str, tuple[list[datetime], list[PriceRow | None]]] = {}

    def lookup(model: str, when: datetime) -> PriceRow | None:
        timeline = timelines.get(model)
        if timeline is None:
            mine = [r for r in rows if matches(r.model_pattern, model)]
            starts = sorted({r.effective_from for r in mine})
            timeline = timelines[model] = (starts, [price_at(mine, model, t) for t in starts])
        starts, prices = timeline
        i = bisect_right(starts, when)
        return prices[i - 1] if i else None

    return lookup


def change_points(
    rows: Sequence[PriceRow], model: str, start: datetime, end: datetime
) -> list[datetime]:
    """Moments strictly inside (start, end) where ``model``'s price may change, sorted."""
    return sorted(
        {
            r.effective_from
            for r in rows
            if start < r.effective_from < end and matches(r.model_pattern, model)
        }
    )


def unmatched_patterns(rows: Iterable[PriceRow], models: Iterable[str]) -> list[str]:
    """The patterns of ``rows`` that match none of ``models``, in table order."""
    names = list(models)
    return [r.model_pattern for r in rows if not any(matches(r.model_pattern, m) for m in names)]
