"""The time types of request bodies: what is stored lies where queries may reach it."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator, AwareDatetime, BeforeValidator

from service.core.querytime import within_range


def time_text(value: object) -> object:
    """``value`` if it is RFC 3339 text (or already a datetime); a number is refused rather
    than read as Unix seconds, as the document declares a string."""
    if isinstance(value, str | datetime):
        return value
    raise ValueError("must be an RFC 3339 time as text, e.g. 2026-12-01T08:00:00Z")


# A stored moment (a job's start and end, a silence's, a price's): 1970-2200 like query times,
# so every later read, default span and JSON rendering of it works.
StoredTime = Annotated[AwareDatetime, BeforeValidator(time_text), AfterValidator(within_range)]
# The same, where the route itself answers a missing timezone with its own message.
StoredTimeAnyZone = Annotated[datetime, BeforeValidator(time_text), AfterValidator(within_range)]
