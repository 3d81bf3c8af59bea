"""Response models of the ladders' audit log (``GET /api/v1/actions``)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class ActionPublic(BaseModel):
    """One step of a policy's ladder on one job as the audit log stored it: what was done (or
    would have been, in a dry run), its outcome and why, with the figures that triggered it."""

    id: int
    at: datetime = Field(description="when the step was recorded (UTC)")
    policy: str
    job_id: str
    user: str | None
    team: str | None
    alert_id: int | None = Field(description="the alert episode the ladder ran in")
    step: int | None = Field(description="the step's index in the ladder (0 first); null: a skip")
    action: str = Field(description="notify_owner or reclaim")
    outcome: str = Field(description="would (dry run), warned, reclaimed, skipped, failed, gone")
    reason: str | None = Field(description="why it was skipped or failed, in words")
    dry_run: bool
    driver: str | None = Field(description="the reclaim driver: slurm, kubernetes or webhook")
    mode: str | None = Field(description="the driver's mode: cancel, requeue, delete_pod, ...")
    detail: str | None = Field(description="what was run or sent: a command, a request, an error")
    value: float | None = Field(description="the policy's value that triggered the step")
    threshold: float | None = Field(description="the policy's threshold")
    since: datetime | None = Field(description="when the condition began (UTC)")
    waste_usd: float | None = Field(description="the job's waste (idle + fixable) then, USD")
    idle_usd: float | None = Field(description="of it, idle, USD")
