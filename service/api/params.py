"""Query and path parameter types shared by the routers, bounded so no value reaches a 500."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator

from service.errors import NotFound

# Times outside this range cannot be stored or shifted by a report's default span without
# overflowing Python's datetime; no telemetry is that old or that far ahead.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)
# Row ids are 32-bit integers in both stores.
MAX_ROW_ID = 2**31 - 1


def bounded_time(value: datetime | None) -> datetime | None:
    """``value`` if it is timezone-aware and within [EARLIEST, LATEST]; ValueError else."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValueError("timestamps need a timezone, e.g. 2026-12-02T08:00:00Z")
    if not EARLIEST <= value <= LATEST:
        raise ValueError(
            f"must be between {EARLIEST.date().isoformat()} and {LATEST.date().isoformat()}"
        )
    return value


TimeParam = Annotated[datetime | None, AfterValidator(bounded_time)]


def row_id(value: int, *, what: str) -> int:
    """``value`` when a stored row could have it; NotFound naming ``what`` otherwise."""
    if not 1 <= value <= MAX_ROW_ID:
        raise NotFound(f"no {what} with id {value}")
    return value
