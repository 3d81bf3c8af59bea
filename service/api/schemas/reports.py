"""Response models of the periodic reports: opt-outs, what was sent, and a report's preview."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from service.api.schemas.derive import mirror
from service.usecases.periodic_reports import ReportPreview


class OptOutPublic(BaseModel):
    """A user or team that gets no periodic report, since when and by whose token."""

    recipient: str
    opted_out_at: datetime
    by: str | None


class ReportSendPublic(BaseModel):
    """One recipient's report of one period: queued (with its deliveries in the outbox),
    opted_out, or no_jobs (a quiet user or team, when those are skipped)."""

    period_start: datetime
    period_end: datetime
    recipient: str
    status: str
    delivery_ids: list[str]
    claimed_at: datetime


@mirror(ReportPreview)
class ReportPreviewPublic(BaseModel):
    """A report as it is sent: its subject, text and HTML, and its figures (USD, GPU-hours)."""
