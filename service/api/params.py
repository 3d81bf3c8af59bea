"""Query and path parameter types shared by the routers, bounded so no value reaches a 500."""

from __future__ import annotations

from service.errors import NotFound

# Row ids are 32-bit integers in both stores.
MAX_ROW_ID = 2**31 - 1


def row_id(value: int, *, what: str) -> int:
    """``value`` when a stored row could have it; NotFound naming ``what`` otherwise."""
    if not 1 <= value <= MAX_ROW_ID:
        raise NotFound(f"no {what} with id {value}")
    return value
