"""Response models of the periodic reports: opt-outs, what was sent, and a report's preview."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel


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


class ReportPreviewPublic(BaseModel):
    """A report as it is sent: its subject, text and HTML, and its figures (USD, GPU-hours)."""

    recipient: str
    period_start: datetime
    period_end: datetime
    subject: str
    text: str
    html: str
    figures: dict[str, Any]
