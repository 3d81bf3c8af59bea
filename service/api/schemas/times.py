"""The time types of request bodies: what is stored lies where queries may reach it."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator, AwareDatetime

from service.querytime import within_range

# A stored moment (a job's start and end, a silence's, a price's): 1970-2200 like query times,
# so every later read, default span and JSON rendering of it works.
StoredTime = Annotated[AwareDatetime, AfterValidator(within_range)]
# The same, where the route itself answers a missing timezone with its own message.
StoredTimeAnyZone = Annotated[datetime, AfterValidator(within_range)]
