"""GPU price table logic: shell-style model patterns to USD per GPU-hour, with effective-from dates.

Pure: takes price rows and a GPU model name, returns prices. Patterns match the model name
case-insensitively; the most specific matching pattern (most literal characters) wins, and
within one pattern the newest row whose effective_from is not after the moment in question.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from fnmatch import fnmatchcase
from typing import Any

from service.errors import ValidationFailed


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


# A MIG instance's model is "<parent model> MIG <profile>", e.g. "NVIDIA H100 80GB HBM3 MIG
# 1g.10gb": <n>g is its share of the parent's compute slices.
_MIG_MODEL = re.compile(r"^(?P<parent>.*?)\s+MIG\s+(?P<profile>(?P<slices>\d+)g\.\d+gb\S*)", re.I)
# Compute slices of a whole GPU: 7 on A100, H100, H200, B200 and friends; 4 on an A30.
_FOUR_SLICE_MODELS = re.compile(r"\bA30\b", re.I)


def mig_share(model: str) -> tuple[str, str, float] | None:
    """(parent model, profile, share of the parent's compute) of a MIG model name, else None."""
    m = _MIG_MODEL.match(model)
    if m is None:
        return None
    parent = m["parent"]
    total = 4 if _FOUR_SLICE_MODELS.search(parent) else 7
    return parent, m["profile"].lower(), min(int(m["slices"]) / total, 1.0)


def price_at(rows: Sequence[PriceRow], model: str, when: datetime) -> PriceRow | None:
    """The row pricing ``model`` at ``when``, or None when no pattern matches (never $0).

    A MIG slice is priced by a row whose pattern names its profile (``*1g.10gb*``); otherwise
    as its compute share of the parent's price (a 1g of a 7-slice H100 is 1/7 of it).
    """
    mig = mig_share(model)
    if mig is None:
        return _best(rows, model, when)
    parent, profile, share = mig
    named = [r for r in rows if profile in r.model_pattern.lower()]
    own = _best(named, model, when)
    if own is not None:
        return own
    whole = _best(rows, parent, when)
    if whole is None:
        return None
    return PriceRow(
        whole.model_pattern,
        whole.usd_per_gpu_hour * share,
        whole.effective_from,
        f"{profile}: {share:.4g} of {whole.model_pattern}",
    )


def _best(rows: Sequence[PriceRow], model: str, when: datetime) -> PriceRow | None:
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
            mig = mig_share(model)
            mine = [
                r
                for r in rows
                if matches(r.model_pattern, model)
                or (mig is not None and matches(r.model_pattern, mig[0]))
            ]
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
    mig = mig_share(model)
    return sorted(
        {
            r.effective_from
            for r in rows
            if start < r.effective_from < end
            and (
                matches(r.model_pattern, model)
                or (mig is not None and matches(r.model_pattern, mig[0]))
            )
        }
    )


_PRICE_KEYS = ("model_pattern", "usd_per_gpu_hour", "effective_from", "note")


def _effective_from(value: Any) -> datetime:
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):  # YAML reads 2026-01-01 as a date: its midnight UTC
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    elif isinstance(value, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", value.strip()):
        day = date.fromisoformat(value.strip())
        return datetime(day.year, day.month, day.day, tzinfo=UTC)
    elif isinstance(value, str):
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    else:
        raise ValueError("must be a date (2026-01-01) or an RFC 3339 time")
    if moment.tzinfo is None:
        raise ValueError("needs a timezone, e.g. 2026-01-01T00:00:00Z, or a date alone")
    return moment.astimezone(UTC)


def parse_price_rows(items: Any, *, where: str = "prices") -> list[PriceRow]:
    """Price rows from a config file's ``prices:`` list; ValidationFailed names the bad field
    (``prices.0.effective_from``)."""
    if not isinstance(items, list):
        raise ValidationFailed(
            where, "must be a list of {model_pattern, usd_per_gpu_hour, effective_from}"
        )
    return [parse_price_row(item, at=f"{where}.{i}") for i, item in enumerate(items)]


def parse_price_row(item: Any, *, at: str) -> PriceRow:
    """One row of a ``prices:`` list; ValidationFailed names the bad field under ``at``."""
    if not isinstance(item, dict):
        raise ValidationFailed(
            at, "must be a mapping with model_pattern, usd_per_gpu_hour and effective_from"
        )
    for key in item:
        if key not in _PRICE_KEYS:
            raise ValidationFailed(f"{at}.{key}", f"unknown key; one of {', '.join(_PRICE_KEYS)}")
    for key in _PRICE_KEYS[:3]:
        if item.get(key) is None:
            raise ValidationFailed(f"{at}.{key}", "is required")
    pattern = item["model_pattern"]
    if not isinstance(pattern, str) or not pattern.strip():
        raise ValidationFailed(f"{at}.model_pattern", "must be a pattern like *H100*")
    try:
        price = float(item["usd_per_gpu_hour"])
    except (TypeError, ValueError):
        price = math.nan
    if not math.isfinite(price) or price < 0 or isinstance(item["usd_per_gpu_hour"], bool):
        raise ValidationFailed(f"{at}.usd_per_gpu_hour", "must be a number of dollars >= 0")
    try:
        effective = _effective_from(item["effective_from"])
    except ValueError as exc:
        raise ValidationFailed(f"{at}.effective_from", str(exc)) from None
    note = item.get("note")
    return PriceRow(pattern, price, effective, None if note is None else str(note))
