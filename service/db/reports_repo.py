"""The periodic reports' claims (once per period and recipient) and the opt-outs."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import cast

from sqlalchemy import Connection, delete, select

from service.db.dialect import insert_ignore
from service.db.rows import OptOutRow, ReportSendRow
from service.db.schema import report_opt_outs, report_sends

PERIOD_MARKER = "__period__"  # the claim saying every recipient of a period was handled


def period_claimed(conn: Connection, *, period_start: datetime) -> bool:
    """Whether the period starting at ``period_start`` was already handled in full."""
    c = report_sends.c
    q = select(c.recipient).where(c.period_start == period_start, c.recipient == PERIOD_MARKER)
    return conn.execute(q).first() is not None


def claim(
    conn: Connection,
    *,
    period_start: datetime,
    period_end: datetime,
    recipient: str,
    status: str,
    delivery_ids: Sequence[str],
    now: datetime,
) -> bool:
    """Claim (period, recipient) for this transaction; False when another already has it.

    On PostgreSQL a concurrent claim of the same key waits for the first transaction and then
    finds the row, so only one of them queues the report.
    """
    row = {
        "period_start": period_start,
        "recipient": recipient,
        "period_end": period_end,
        "status": status,
        "delivery_ids": list(delivery_ids),
        "claimed_at": now,
    }
    result = conn.execute(insert_ignore(conn, report_sends, ["period_start", "recipient"]), row)
    return bool(result.rowcount)


def sends(
    conn: Connection, *, period_start: datetime | None = None, limit: int = 1000
) -> list[ReportSendRow]:
    """The claims (newest period first), of one period if given, without the markers."""
    c = report_sends.c
    q = select(report_sends).where(c.recipient != PERIOD_MARKER)
    if period_start is not None:
        q = q.where(c.period_start == period_start)
    q = q.order_by(c.period_start.desc(), c.recipient).limit(limit)
    return [cast(ReportSendRow, dict(r._mapping)) for r in conn.execute(q)]


def opted_out(conn: Connection) -> set[str]:
    """The recipients who opted out."""
    return set(conn.execute(select(report_opt_outs.c.recipient)).scalars())


def list_opt_outs(conn: Connection) -> list[OptOutRow]:
    """Every opt-out, by recipient."""
    q = select(report_opt_outs).order_by(report_opt_outs.c.recipient)
    return [cast(OptOutRow, dict(r._mapping)) for r in conn.execute(q)]


def opt_out(conn: Connection, *, recipient: str, by: str | None, now: datetime) -> None:
    """Record that ``recipient`` gets no more reports (a second time changes nothing)."""
    stmt = insert_ignore(conn, report_opt_outs, ["recipient"])
    conn.execute(stmt, {"recipient": recipient, "opted_out_at": now, "by": by})


def opt_in(conn: Connection, *, recipient: str) -> bool:
    """Remove ``recipient``'s opt-out; False when there was none."""
    q = delete(report_opt_outs).where(report_opt_outs.c.recipient == recipient)
    return bool(conn.execute(q).rowcount)
