"""Request and response bodies of a job's progress counter (``/jobs/{id}/progress``)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from service.api.schemas.derive import mirror
from service.api.schemas.times import StoredTime
from service.core.progress import ProgressSummary, Reading
from service.vocabulary import ProgressUnit


class ProgressCreate(BaseModel):
    """``POST /jobs/{id}/progress``: the job's running total of ``unit`` now (or at ``at``)."""

    model_config = ConfigDict(extra="forbid")

    unit: ProgressUnit = Field(description="steps, samples or tokens; a job keeps one unit")
    value: float = Field(
        ge=0,
        allow_inf_nan=False,
        description="the job's running total in ``unit`` since it started (monotonic: never "
        "below the last value sent)",
    )
    at: StoredTime | None = Field(None, description="when the total was read; default now")


class ReadingPublic(BaseModel):
    """One stored reading."""

    at: datetime
    unit: ProgressUnit
    value: float

    @classmethod
    def of(cls, reading: Reading) -> ReadingPublic:
        """The public form of ``reading``."""
        return cls(at=reading.at, unit=reading.unit, value=reading.value)


class ProgressAccepted(ReadingPublic):
    """The reading accepted; ``stored`` is false for a repeat of the last one (a retry)."""

    job_id: str
    stored: bool


@mirror(ProgressSummary)
class ProgressSummaryPublic(BaseModel):
    """What a job's readings add up to."""

    units_advanced: float = Field(description="last_value - first_value")
    rate_per_second: float | None = Field(
        description="units advanced per second between the first and last reading (null with "
        "one reading)"
    )
    last_advanced_at: datetime | None = Field(
        description="the time of the reading at which the total last went up (null: never)"
    )


class JobProgressPublic(BaseModel):
    """A job's progress readings in time order and their summary (null: none reported)."""

    job_id: str
    readings: list[ReadingPublic]
    summary: ProgressSummaryPublic | None
