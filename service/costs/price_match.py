"""Pick the price of a GPU model from the price table (pure: rows and `now` in, USD out)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from fnmatch import fnmatchcase


@dataclass(frozen=True, slots=True)
class PriceRow:
    """One price-table row: a shell-style model pattern and its USD per GPU-hour from a date."""

    model_pattern: str
    usd_per_gpu_hour: float
    effective_from: datetime


def price_per_gpu_hour(model: str, prices: Iterable[PriceRow], now: datetime) -> float | None:
    """USD per GPU-hour for ``model`` at ``now``, or None when no pattern matches.

    Among rows already in effect whose pattern matches the model name, the longest pattern
    (the most specific) wins, and among rows of that pattern the latest effective_from.
    """
    best: PriceRow | None = None
    for row in prices:
        if row.effective_from > now or not fnmatchcase(model, row.model_pattern):
            continue
        if best is None or (len(row.model_pattern), row.effective_from) > (
            len(best.model_pattern),
            best.effective_from,
        ):
            best = row
    return None if best is None else best.usd_per_gpu_hour
