"""Response bodies of proven savings (issue 46): a job's ``savings`` and the savings ledger."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

SavingVerdict = Literal["saved", "no_measurable_change", "worse", "not_compared"]


class SavingPublic(BaseModel):
    """What a later run saved against the earlier run of its work that was told a fix."""

    work_key: str = Field(description="the work key the two runs share")
    compared_with: str = Field(description="the earlier run's job id")
    unit: Literal["progress", "run"] = Field(
        description="progress: GPU-seconds per unit of reported progress; run: the whole run "
        "(a fixed-size job that reported none)"
    )
    fix_cause: str | None = Field(
        description="the cause whose fix the later run applied (its share fell to at most "
        "half); null where no told fix's cause fell"
    )
    fix_share_before: float = Field(description="that cause's share of the earlier run (0-1)")
    fix_share_after: float = Field(description="its share of the later run (0-1)")
    promised_fraction: float | None = Field(
        description="the applied fix's promised saving, a share of the earlier run"
    )
    promised_usd: float | None = Field(description="the applied fix's promised saving (USD)")
    realised_fraction: float | None = Field(
        description="1 - GPU-seconds per unit after / before, at most the earlier run's waste share"
    )
    realised_usd: float | None = Field(
        description="the realised share of the earlier run's GPU-seconds at the later run's "
        "price (0 inside the noise; never more than the earlier run's waste)"
    )
    noise_fraction: float | None = Field(
        description="the key's run-to-run spread of GPU-seconds per unit before the fix, at "
        "least the noise floor"
    )
    verdict: SavingVerdict
    reason: str | None = Field(
        description="why not compared, why inside the noise, or that the saving was capped"
    )
    fix_applied: bool = Field(
        False,
        description="whether this run already applies fix_cause's fix (the work did not "
        "change; a running run by its shares so far): no surface tells it that fix",
    )


class LedgerRowPublic(BaseModel):
    """Realised and promised savings of one group in one month (later runs' ends, UTC)."""

    group: str
    month: str = Field(description="YYYY-MM")
    pairs: int
    realised_usd: float
    promised_usd: float
    jobs: list[str] = Field(description="the later runs booked in the row")


class LedgerTotalsPublic(BaseModel):
    """The rows' sums (to the cent)."""

    pairs: int
    realised_usd: float
    promised_usd: float


class LedgerPairPublic(SavingPublic):
    """A pair behind the ledger: the later run, its owner, month, and whether it is booked."""

    job_id: str
    team: str | None
    user: str | None
    project: str | None
    month: str
    booked: bool = Field(description="a fix was applied and the runs compared")


class CalibrationPublic(BaseModel):
    """A cause's compared pairs and the factor its promises carry (from 20 pairs on)."""

    cause: str
    pairs: int
    median_promised_fraction: float
    median_realised_fraction: float
    factor: float | None = Field(
        description="median realised / median promised; null under 20 pairs"
    )


class SavingsLedgerPublic(BaseModel):
    """``GET /reports/savings``: realised savings per group and month, the promises beside
    them, every pair, and the calibration per cause."""

    start: datetime
    end: datetime
    group_by: Literal["team", "user", "project"]
    rows: list[LedgerRowPublic]
    totals: LedgerTotalsPublic
    pairs: list[LedgerPairPublic]
    calibration: list[CalibrationPublic]
