"""``/api/v1/reports/periodic``, ``/reports/sends`` and ``/reports/opt-outs``: the weekly (or
daily) report of a user, a team or the admins, what was sent, and who opted out."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from fastapi import APIRouter, Path, Query, status

from service.api import query
from service.api.deps import Ctx, Expensive, ReadConn, Reader, ScopedReader, WriteConn
from service.api.schemas.reports import OptOutPublic, ReportPreviewPublic, ReportSendPublic
from service.db import reports_repo
from service.db.rows import OptOutRow, ReportSendRow
from service.db.tokens_repo import TokenInfo
from service.errors import Forbidden, NotFound
from service.roles import Role
from service.usecases import periodic_reports

router = APIRouter(prefix="/reports", tags=["reports"])

OwnerName = Path(min_length=1, max_length=255, description="the user's or team's name")


def _may_change(token: TokenInfo, kind: str, name: str) -> None:
    """An admin changes anyone's report; a person signed in changes their own (self-service);
    Forbidden else."""
    if token.role is Role.ADMIN:
        return
    if token.person is not None and kind == "user" and name == token.person.user:
        return
    raise Forbidden(
        "name: an admin changes anyone's report; a person signed in to the console their own"
    )


@router.get("/periodic", response_model=ReportPreviewPublic, dependencies=[Expensive])
def periodic_report(
    ctx: Ctx,
    conn: ReadConn,
    _: Reader,
    user: str | None = Query(None, max_length=255, description="this user's report"),
    team: str | None = Query(None, max_length=255, description="this team's report"),
    at: str | None = Query(
        None, description=f"the period due last at this time ({query.TIME_HELP}); default now"
    ),
) -> periodic_reports.ReportPreview:
    """A user's, a team's or (with neither) the admins' report of the last period ended, as
    it is sent: subject, text, HTML and figures."""
    if user is not None and team is not None:
        raise query.query_error("team", "ask for a user's or a team's report, not both")
    recipient = f"user:{user}" if user else f"team:{team}" if team else "admins"
    now = ctx.clock()
    when: datetime = query.instant("at", at, now=now) or now
    return periodic_reports.preview(
        conn, settings=ctx.settings, recipient=recipient, at=when, now=now
    )


@router.get("/sends", response_model=list[ReportSendPublic])
def report_sends(
    conn: ReadConn,
    _: Reader,
    limit: int = Query(1000, ge=1, le=10_000),
) -> list[ReportSendRow]:
    """The reports claimed for sending, newest period first, with each recipient's outcome."""
    return reports_repo.sends(conn, limit=limit)


@router.get("/opt-outs", response_model=list[OptOutPublic])
def list_opt_outs(conn: ReadConn, token: ScopedReader) -> list[OptOutRow]:
    """The users and teams that get no periodic report (a person: of themselves and their
    teams)."""
    rows = reports_repo.list_opt_outs(conn)
    scope = token.scope
    if scope is None:
        return rows
    own = {f"user:{u}" for u in scope.users} | {f"team:{t}" for t in scope.teams}
    return [r for r in rows if r["recipient"] in own]


@router.put("/opt-outs/{kind}/{name}", response_model=OptOutPublic)
def opt_out(
    kind: Literal["user", "team"], ctx: Ctx, conn: WriteConn, token: ScopedReader,
    name: str = OwnerName,
) -> OptOutRow:  # fmt: skip
    """Stop the periodic report of a user or team (again: no change); a person signed in may
    stop their own."""
    _may_change(token, kind, name)
    recipient = f"{kind}:{name}"
    by = token.actor if token.person is not None else token.name or f"token {token.prefix}"
    reports_repo.opt_out(conn, recipient=recipient, by=by, now=ctx.clock())
    return next(r for r in reports_repo.list_opt_outs(conn) if r["recipient"] == recipient)


@router.delete("/opt-outs/{kind}/{name}", status_code=status.HTTP_204_NO_CONTENT)
def opt_in(
    kind: Literal["user", "team"], conn: WriteConn, token: ScopedReader, name: str = OwnerName
) -> None:
    """Send a user's or team's periodic report again; a person signed in may restart their own."""
    _may_change(token, kind, name)
    if not reports_repo.opt_in(conn, recipient=f"{kind}:{name}"):
        raise NotFound(f"{kind} {name!r} has not opted out")
