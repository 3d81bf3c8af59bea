"""``/unsubscribe``: the periodic report's one-click link (RFC 8058). A GET (a person, or a mail
scanner following links) shows a button and changes nothing; a POST (the button, or the mail
client's own unsubscribe) stops the report. Both need the link's signature, never a login."""

from __future__ import annotations

import html
from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import HTMLResponse
from sqlalchemy import Connection

from service.api.deps import Ctx
from service.core.unsubscribe import PATH
from service.usecases import periodic_reports

router = APIRouter(include_in_schema=False)

Recipient = Query(alias="r", min_length=1, max_length=300, description="user:<name> or team:<name>")
Signature = Query(alias="s", min_length=1, max_length=64, description="the link's signature")
# No script, no outside resource; the signed link is not sent on to anyone.
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


def link_conn(ctx: Ctx) -> Iterator[Connection]:
    """A write connection without a login: the link's signature is the credential."""
    with ctx.engine.begin() as conn:
        yield conn


# scope="function": committed before the answer, as every write route's.
LinkConn = Annotated[Connection, Depends(link_conn, scope="function")]


def _page(title: str, body: str, status_code: int = 200) -> HTMLResponse:
    doc = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>{html.escape(title)}</title></head>"
        "<body style='font-family:Helvetica,Arial,sans-serif;max-width:560px;margin:40px auto;"
        f"padding:0 16px;color:#101828'><h1 style='font-size:20px'>{html.escape(title)}</h1>"
        f"{body}</body></html>"
    )
    return HTMLResponse(doc, status_code=status_code, headers=_HEADERS)


def _refused() -> HTMLResponse:
    return _page(
        "This link is not valid",
        "<p>The link's signature (parameter s) does not match its recipient (parameter r).</p>",
        status_code=403,
    )


@router.get(PATH)
def confirm(ctx: Ctx, conn: LinkConn, r: str = Recipient, s: str = Signature) -> HTMLResponse:
    """The page behind the mail's link: a button that stops the report."""
    if not periodic_reports.link_is_valid(conn, ctx, recipient=r, sig=s):
        return _refused()
    who = html.escape(r)
    form = (
        f"<p>Stop the periodic GPU Warden report of <strong>{who}</strong>?</p>"
        "<form method='post'><button type='submit' style='font-size:16px;padding:8px 16px'>"
        "Stop my reports</button></form>"
    )
    return _page("Stop these reports", form)


@router.post(PATH)
def stop(ctx: Ctx, conn: LinkConn, r: str = Recipient, s: str = Signature) -> HTMLResponse:
    """Stop the report (a mail client's one-click POST, or the page's button)."""
    if not periodic_reports.stop_by_link(conn, ctx, recipient=r, sig=s):
        return _refused()
    return _page(
        "Reports stopped",
        f"<p>{html.escape(r)} gets no more periodic reports. An admin can start them again"
        " (<code>DELETE /api/v1/reports/opt-outs/...</code>).</p>",
    )
