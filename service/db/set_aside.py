"""Stored rows a background round cannot use: how they are recognised and reported.

A row can reach the database without passing ingest (an older release, a restore, a hand-made
insert). A round that meets one leaves it out, says which it was, and goes on with the rest, so
no single row can stop rollups, evaluation, retention or the outbox.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, or_

from service.vocabulary import METRIC_BOUNDS


@dataclass(frozen=True, slots=True)
class SetAside:
    """One row a round left out: the round, which row, and why."""

    round: str  # rollup, evaluate, retention, deliver
    row: str  # e.g. "sample of GPU 3 at 2026-12-02T08:00:00+00:00"
    reason: str


def impossible(names: Sequence[str], values: Sequence[Any]) -> list[str]:
    """The names whose value lies outside ``METRIC_BOUNDS`` (NaN and infinities included)."""
    out = []
    for name, value in zip(names, values, strict=True):
        bounds = METRIC_BOUNDS.get(name)
        if value is not None and bounds is not None and not bounds[0] <= value <= bounds[1]:
            out.append(name)
    return out


def possible(column: Any, name: str) -> Any:
    """SQL: the column's value where it lies within ``name``'s bounds, else NULL (set aside).

    NaN is larger than every number in PostgreSQL and SQLite stores it as NULL, so both fall out.
    """
    low, high = METRIC_BOUNDS[name]
    return case((and_(column >= low, column <= high), column), else_=None)


def any_impossible(columns: Sequence[tuple[Any, str]]) -> Any:
    """SQL: 1 when any of (column, metric name) holds a value outside its bounds, else 0."""
    tests = [
        and_(col.is_not(None), or_(col < METRIC_BOUNDS[n][0], col > METRIC_BOUNDS[n][1]))
        for col, n in columns
    ]
    return case((or_(*tests), 1), else_=0)
