"""Stored rows a background round cannot use: how they are recognised and reported.

A row can reach the database without passing ingest (an older release, a restore, a hand-made
insert). A round that meets one leaves it out, says which it was, and goes on with the rest, so
no single row can stop rollups, evaluation, retention or the outbox.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, or_

from service.vocabulary import METRIC_BOUNDS


@dataclass(frozen=True, slots=True)
class SetAside:
    """One row a round left out: the round, which row, and why."""

    round: str  # rollup, evaluate, deliver
    row: str  # e.g. "sample of GPU 3 at 2026-12-02T08:00:00+00:00"
    reason: str
    count: int = 1  # rows this line stands for ("12 samples of GPU 3 in the last 300 s")


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


def possible_text(column: str, name: str) -> str:
    """``possible`` as SQL text, for statements written as text: ``column``'s value where it
    lies within ``name``'s bounds, else NULL."""
    low, high = METRIC_BOUNDS[name]
    return f"(CASE WHEN {column} >= {low!r} AND {column} <= {high!r} THEN {column} END)"


def any_impossible(columns: Sequence[tuple[Any, str]]) -> Any:
    """SQL: 1 when any of (column, metric name) holds a value outside its bounds, else 0."""
    tests = [
        and_(col.is_not(None), or_(col < METRIC_BOUNDS[n][0], col > METRIC_BOUNDS[n][1]))
        for col, n in columns
    ]
    return case((or_(*tests), 1), else_=0)


# At most this many set-aside rows are logged one by one per round; the rest as a count.
LOG_LINES = 20


def report(rows: Sequence[SetAside], *, counter: Any, log: logging.Logger) -> None:
    """Log the rows a round left out (which and why) and count them in ``counter`` by round."""
    for row in rows[:LOG_LINES]:
        log.warning("%s set aside %s: %s", row.round, row.row, row.reason)
    if len(rows) > LOG_LINES:
        log.warning("... and %d more rows set aside", len(rows) - LOG_LINES)
    for row in rows:
        counter.labels(row.round).inc(row.count)
